"""The general vetoes (opposites in any inflection, particles, comparisons,
politeness, several words replaced) and the morphology under them, against
hand-written English examples: each pair's meaning was judged by hand."""

import pytest

from hybridkv.semantic.guards import REWORDED_SIMILARITY, conflicts
from hybridkv.semantic.lexicon import are_opposites, are_synonyms, bases, comparative

VETOED = [
    # opposites, inflected
    ("Why does the bakery open early on Sundays?", "Why does the bakery close early on Sundays?",
     "opposite"),
    ("Which is heavier, gold or silver?", "Which is lighter, gold or silver?", "opposite"),
    ("Why are my plants growing so slowly?", "Why are my plants shrinking so slowly?",
     "opposite"),
    ("Are mortgage rates rising this year?", "Are mortgage rates falling this year?",
     "opposite"),
    ("Is the 7 am bus to Galway on time?", "Is the 7 pm bus to Galway on time?", "opposite"),
    # particles that flip the request
    ("How do I log in to my bank account?", "How do I log out of my bank account?",
     "particle"),
    ("How do I turn the porch light on?", "How do I turn the porch light off?", "particle"),
    ("Can I turn up the heating at night?", "Can I turn down the heating at night?",
     "particle"),
    ("Should I water tomatoes before sunrise?", "Should I water tomatoes after sunrise?",
     "particle"),
    ("How do I zoom in on the map in my car?", "How do I zoom out on the map in my car?",
     "particle"),
    # another comparison between the same things
    ("Which is faster, a cheetah or a horse?", "Which is stronger, a cheetah or a horse?",
     "comparison"),
    ("Which costs more, renting or buying a flat?", "Which is cheaper, renting or buying a flat?",
     "comparison"),
    ("Which car uses more fuel, a sedan or a van?", "Which car is quieter, a sedan or a van?",
     "comparison"),
    # a number that counts another thing
    ("How many pecks are in 3 bushels?", "How many bushels are in 3 pecks?", "numbers"),
    ("How many lira do I get for 200 rupees?", "How many rupees do I get for 200 lira?",
     "numbers"),
    # "please" as the word asked about, not as politeness
    ("How do you say please in Hindi?", "How do you say hello in Hindi?", "substitution"),
    ("What is the Hindi word for please?", "What is the Hindi word for goodbye?",
     "substitution"),
]

ALLOWED = [
    ("Please tell me the boiling point of water.", "What is the boiling point of water?"),
    ("Could you please list the planets of the solar system?",
     "List the planets of the solar system."),
    ("Is Rome bigger than Milan?", "Is Rome larger than Milan?"),
    ("How do I update Firefox on Android?", "How to update Firefox on Android?"),
    ("What is the meaning of the word quixotic?", "What does quixotic mean?"),
    ("How do I switch on dark mode?", "How do I turn on dark mode?"),
    ("How many pecks are in 3 bushels?", "3 bushels is how many pecks?"),
]


@pytest.mark.parametrize("a,b,reason", VETOED)
def test_general_vetoes_name_the_difference(a, b, reason):
    assert conflicts(a, b) == reason
    assert conflicts(b, a) == reason


@pytest.mark.parametrize("a,b", ALLOWED)
def test_paraphrases_pass(a, b):
    assert conflicts(a, b) is None
    assert conflicts(b, a) is None


def test_several_replaced_words_need_a_nearly_identical_embedding():
    a, b = "How long is the drive from Leeds to York?", "How far is Leeds from York?"
    assert conflicts(a, b, REWORDED_SIMILARITY - 0.05) == "rewording"
    assert conflicts(b, a, REWORDED_SIMILARITY - 0.05) == "rewording"
    assert conflicts(a, b, REWORDED_SIMILARITY + 0.01) is None


def test_one_sided_additions_are_not_a_rewording():
    assert conflicts("Which city is the capital of Chad?", "What is the capital of Chad?",
                     0.5) is None


@pytest.mark.parametrize("word,base", [("heavier", "heavy"), ("biggest", "big"),
                                       ("later", "late"), ("better", "good"),
                                       ("fewest", "less"), ("quieter", "quiet")])
def test_comparative_names_the_adjective(word, base):
    assert comparative(word) == base


@pytest.mark.parametrize("word", ["water", "number", "after", "computer", "summer", "never"])
def test_words_ending_in_er_are_not_all_comparatives(word):
    assert comparative(word) is None


def test_bases_undo_regular_endings():
    assert {"close"} <= bases("closes") and {"close"} <= bases("closing")
    assert {"stop"} <= bases("stopped") and {"heavy"} <= bases("heaviest")


def test_opposites_and_synonyms_through_inflections():
    assert are_opposites("opened", "closes") and are_opposites("warmer", "cooler")
    assert not are_opposites("opened", "opens")
    assert are_synonyms("weighs", "weight") and are_synonyms("meaning", "means")
    assert not are_synonyms("install", "update")
