"""The second held-out set: well-formed, balanced, and apart from the two other
labeled sets in families, vocabulary, texts and templates.

Oracles: invariants over the whole set (one text never carries two labels; a
group's paraphrases share its base's label, its negatives do not), counts of
labels, and disjointness against `labeled_pairs` and `heldout_pairs`, where a
template is a text with every slot word (any module's vocabulary) and
number masked.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from hybridkv.semantic import heldout2_pairs, heldout_pairs, labeled_pairs

SEEDS = (0, 1, 2)
OTHERS = ((labeled_pairs, 60), (heldout_pairs, 30))
NEGATIVE_KINDS = {"negation", "swap", "number", "unit", "reverse", "intent", "entity",
                  "antonym", "particle", "comparative"}


def _texts(module, families: int) -> set[str]:
    return {q.text for s in SEEDS for g in module.questions(s, families) for q in g}


def _vocabulary(module) -> set[str]:
    """Every word of the module's upper-case tuples and lists (nested ones too)."""
    found: set[str] = set()

    def walk(value) -> None:
        if isinstance(value, str):
            found.update(value.split())
        elif isinstance(value, (tuple, list)):
            for item in value:
                walk(item)

    for name, value in vars(module).items():
        if name.isupper() and isinstance(value, (tuple, list)):
            walk(value)
    return found


def _template(text: str, slots: set[str]) -> str:
    masked = [("#" if w[0].isdigit() else "X" if w in slots else w.lower())
              for w in re.findall(r"[A-Za-z0-9]+", text)]
    return " ".join(masked)


@pytest.mark.parametrize("seed", SEEDS)
def test_one_text_never_carries_two_labels(seed):
    text_to_label: dict[str, str] = {}
    for group in heldout2_pairs.questions(seed, 30):
        for q in group:
            assert text_to_label.setdefault(q.text, q.label) == q.label, q.text


@pytest.mark.parametrize("seed", SEEDS)
def test_paraphrases_share_the_base_label_and_negatives_do_not(seed):
    groups = heldout2_pairs.questions(seed, 30)
    assert len({g[0].text for g in groups}) == len(groups)
    for base, *rest in groups:
        assert base.kind == "base"
        for q in rest:
            assert q.kind == "paraphrase" or q.kind in NEGATIVE_KINDS, q
            assert (q.label == base.label) == (q.kind == "paraphrase"), (base.text, q)


def test_labels_are_balanced_and_every_negative_kind_is_present():
    kinds = Counter(q.kind for g in heldout2_pairs.questions(0, 30) for q in g[1:])
    paraphrases = kinds.pop("paraphrase")
    negatives = sum(kinds.values())
    assert 0.8 <= paraphrases / negatives <= 1.25, (paraphrases, negatives)
    assert set(kinds) == NEGATIVE_KINDS


def test_every_family_gives_its_instances():
    bases = Counter(g[0].label.split(":")[0] for g in heldout2_pairs.questions(0, 30))
    assert len(bases) == len(heldout2_pairs.HELDOUT2_FAMILIES)
    assert min(bases.values()) >= 10, bases


def test_deterministic_for_a_seed_and_different_across_seeds():
    assert heldout2_pairs.questions(4, 10) == heldout2_pairs.questions(4, 10)
    assert heldout2_pairs.questions(4, 10) != heldout2_pairs.questions(5, 10)


def test_no_family_vocabulary_or_text_shared_with_the_other_sets():
    mine = _texts(heldout2_pairs, 30)
    own_words = {w.lower() for w in _vocabulary(heldout2_pairs)}
    families = set(heldout2_pairs.HELDOUT2_FAMILIES)
    for module, count in OTHERS:
        other_families = getattr(module, "FAMILIES", getattr(module, "HELDOUT_FAMILIES", {}))
        assert not families & set(other_families)
        assert not own_words & {w.lower() for w in _vocabulary(module)}
        assert mine and not mine & _texts(module, count)


def test_no_template_shared_with_the_other_sets():
    slots = _vocabulary(heldout2_pairs)
    for module, _ in OTHERS:
        slots |= _vocabulary(module)
    mine = {_template(t, slots) for t in _texts(heldout2_pairs, 30)}
    for module, count in OTHERS:
        theirs = {_template(t, slots) for t in _texts(module, count)}
        assert not mine & theirs, sorted(mine & theirs)[:5]
