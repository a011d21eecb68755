"""The command line's defaults: thresholds are learned under a 1% error bound,
so a cold cache answers only exact repeats and verifies every paraphrase;
`--semantic-error-bound none` serves a paraphrase at the fixed threshold."""

import argparse

import pytest
from prometheus_client import CollectorRegistry

from hybridkv.semantic.options import add_semantic_arguments, build_front

QUESTION = "What is the capital city of Zorblax?"
PARAPHRASE = "What's the capital city of Zorblax?"


def front(*argv):
    parser = argparse.ArgumentParser()
    add_semantic_arguments(parser)
    args = parser.parse_args(["--semantic-cache", "memory://?size=10", *argv])
    return build_front(args, "m", CollectorRegistry())


def answered(cache, text):
    found = cache.lookup("scope", text)
    cache.insert(found, "Zorb City.", "stop", 3)
    return found


def test_default_learns_under_one_percent_and_verifies_a_cold_paraphrase():
    cache = front().cache
    assert cache.policy.error_bound == 0.01
    assert answered(cache, QUESTION).action == "miss"
    assert cache.lookup("scope", QUESTION).action == "serve"  # an exact repeat
    found = cache.lookup("scope", PARAPHRASE)
    assert found.action == "verify" and found.entry is not None


def test_none_serves_a_paraphrase_at_the_fixed_threshold():
    cache = front("--semantic-error-bound", "none").cache
    assert cache.policy.error_bound is None
    answered(cache, QUESTION)
    found = cache.lookup("scope", PARAPHRASE)
    assert found.action == "serve" and found.similarity >= 0.9


@pytest.mark.parametrize("value", ["abc", "0", "1", "-0.5"])
def test_bad_error_bound_names_the_option(value, capsys):
    with pytest.raises((SystemExit, ValueError)) as caught:
        front("--semantic-error-bound", value)
    text = str(caught.value) + capsys.readouterr().err
    assert "--semantic-error-bound" in text
