"""The held-out labeled questions: well-formed, consistent, and apart from the
generated set the lexical checks were developed on.

Oracles: invariants over the whole set (one text never carries two labels;
a group's paraphrases share its base's label and its negatives do not),
symmetric relations checked against the sorted pair written out by hand,
and set disjointness against `labeled_pairs`.
"""

from __future__ import annotations

import re

import pytest

from hybridkv.semantic import heldout_pairs, labeled_pairs

SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
def test_one_text_never_carries_two_labels(seed):
    text_to_label: dict[str, str] = {}
    for group in heldout_pairs.questions(seed, 30):
        for q in group:
            assert text_to_label.setdefault(q.text, q.label) == q.label, q.text


@pytest.mark.parametrize("seed", SEEDS)
def test_paraphrases_share_the_base_label_and_negatives_do_not(seed):
    groups = heldout_pairs.questions(seed, 30)
    assert len({g[0].text for g in groups}) == len(groups)
    for base, *rest in groups:
        assert base.kind == "base"
        for q in rest:
            assert (q.label == base.label) == (q.kind == "paraphrase"), (base.text, q)


def test_deterministic_for_a_seed_and_different_across_seeds():
    assert heldout_pairs.questions(4, 10) == heldout_pairs.questions(4, 10)
    assert heldout_pairs.questions(4, 10) != heldout_pairs.questions(5, 10)


def test_symmetric_relations_label_the_sorted_pair():
    seen = 0
    for group in heldout_pairs.questions(0, 30):
        match = re.fullmatch(r"How far is (\w+) from (\w+)\?", group[0].text)
        if match is None:
            continue
        a, b = match.groups()
        first, second = (a, b) if a < b else (b, a)
        assert group[0].label == f"distance:{first}:{second}"
        flipped = [q for q in group if q.text == f"How far is {b} from {a}?"]
        assert flipped and flipped[0].label == group[0].label
        seen += 1
    assert seen >= 10


def test_no_family_or_text_shared_with_the_generated_set():
    assert not set(heldout_pairs.HELDOUT_FAMILIES) & set(labeled_pairs.FAMILIES)
    generated = {q.text for s in SEEDS for g in labeled_pairs.questions(s, 60) for q in g}
    held = {q.text for s in SEEDS for g in heldout_pairs.questions(s, 30) for q in g}
    assert held and not generated & held
