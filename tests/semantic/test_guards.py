"""The lexical vetoes against hand-labeled pairs."""

import pytest

from hybridkv.semantic.guards import conflicts
from hybridkv.semantic.normalize import normalize

VETOED = [
    ("Is coffee bad for your health?", "Is coffee not bad for your health?", "negation"),
    ("Does it work offline?", "Doesn't it work offline?", "negation"),
    ("Is Paris bigger than London?", "Is London bigger than Paris?", "order"),
    ("Convert 5 km to miles", "Convert 5 miles to km", "order"),
    ("Convert 5 km to miles", "Convert 7 km to miles", "numbers"),
    ("What is two plus three?", "What is two plus four?", "numbers"),
    ("How do I install Python on Windows?", "How do I uninstall Python on Windows?",
     "opposite"),
    ("Should I buy Tesla stock?", "Should I sell Tesla stock?", "opposite"),
    ("Who wrote Hamlet?", "When was Hamlet written?", "question"),
    ("What is the capital of Peru?", "What is the capital of Chile?", "names"),
    ("Convert 8 hours to minutes", "Convert 8 hours to days", "names"),
    ("How do I install Vim on Debian?", "How do I update Vim on Debian?", "substitution"),
]

ALLOWED = [
    ("What is the capital of France?", "What's the capital of France?"),
    ("Is Paris bigger than London?", "Is Paris larger than London?"),
    ("How do I reverse a list in Python?", "How can I reverse a Python list?"),
    ("Is drinking coffee harmful to health?", "Is coffee bad for your health?"),
    ("Convert 5 km to miles", "What is 5 km in miles?"),
    ("What is five plus 3?", "What is 5 plus three?"),
]


@pytest.mark.parametrize("a,b,reason", VETOED)
def test_vetoes_name_the_difference(a, b, reason):
    assert conflicts(a, b) == reason
    assert conflicts(b, a) == reason


@pytest.mark.parametrize("a,b", ALLOWED)
def test_paraphrases_pass(a, b):
    assert conflicts(a, b) is None
    assert conflicts(b, a) is None


def test_normalize_ignores_case_space_and_edge_punctuation():
    assert normalize("  What is  HTTP? ") == normalize("what is http") == "what is http"
    assert normalize("Is 3.5 > 2?") != normalize("Is 35 > 2?")
