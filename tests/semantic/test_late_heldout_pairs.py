"""The second and third held-out sets: well-formed, balanced, and apart from
every set written before them in families, vocabulary, texts and templates.

Oracles: invariants over the whole set (one text never carries two labels; a
group's paraphrases share its base's label, its negatives do not), counts of
labels, and disjointness against the earlier sets, where a template is a
text with every slot word (any module's vocabulary) and number masked.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from hybridkv.semantic import heldout2_pairs, heldout3_pairs, heldout_pairs, labeled_pairs

SEEDS = (0, 1, 2)
EARLIER = {heldout2_pairs: ((labeled_pairs, 60), (heldout_pairs, 30)),
           heldout3_pairs: ((labeled_pairs, 60), (heldout_pairs, 30), (heldout2_pairs, 30))}
LATE = list(EARLIER)
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


def _families(module) -> dict:
    return next(v for k, v in vars(module).items() if k.endswith("FAMILIES"))


def _template(text: str, slots: set[str]) -> str:
    masked = [("#" if w[0].isdigit() else "X" if w in slots else w.lower())
              for w in re.findall(r"[A-Za-z0-9]+", text)]
    return " ".join(masked)


@pytest.mark.parametrize("module", LATE)
@pytest.mark.parametrize("seed", SEEDS)
def test_one_text_never_carries_two_labels(module, seed):
    text_to_label: dict[str, str] = {}
    for group in module.questions(seed, 30):
        for q in group:
            assert text_to_label.setdefault(q.text, q.label) == q.label, q.text


@pytest.mark.parametrize("module", LATE)
@pytest.mark.parametrize("seed", SEEDS)
def test_paraphrases_share_the_base_label_and_negatives_do_not(module, seed):
    groups = module.questions(seed, 30)
    assert len({g[0].text for g in groups}) == len(groups)
    for base, *rest in groups:
        assert base.kind == "base"
        for q in rest:
            assert q.kind == "paraphrase" or q.kind in NEGATIVE_KINDS, q
            assert (q.label == base.label) == (q.kind == "paraphrase"), (base.text, q)


@pytest.mark.parametrize("module", LATE)
def test_labels_are_balanced_and_every_negative_kind_is_present(module):
    kinds = Counter(q.kind for g in module.questions(0, 30) for q in g[1:])
    paraphrases = kinds.pop("paraphrase")
    negatives = sum(kinds.values())
    assert 0.8 <= paraphrases / negatives <= 1.25, (paraphrases, negatives)
    assert set(kinds) <= NEGATIVE_KINDS and len(kinds) >= 8, kinds


@pytest.mark.parametrize("module", LATE)
def test_every_family_gives_its_instances(module):
    bases = Counter(g[0].label.split(":")[0] for g in module.questions(0, 30))
    assert len(bases) == len(_families(module))
    assert min(bases.values()) >= 8, bases


@pytest.mark.parametrize("module", LATE)
def test_deterministic_for_a_seed_and_different_across_seeds(module):
    assert module.questions(4, 10) == module.questions(4, 10)
    assert module.questions(4, 10) != module.questions(5, 10)


@pytest.mark.parametrize("late", LATE)
def test_no_family_vocabulary_or_text_shared_with_earlier_sets(late):
    mine = _texts(late, 30)
    own_words = {w.lower() for w in _vocabulary(late)}
    families = set(_families(late))
    for module, count in EARLIER[late]:
        assert not families & set(_families(module))
        assert not own_words & {w.lower() for w in _vocabulary(module)}
        assert mine and not mine & _texts(module, count)


@pytest.mark.parametrize("late", LATE)
def test_no_template_shared_with_earlier_sets(late):
    slots = _vocabulary(late)
    for module, _ in EARLIER[late]:
        slots |= _vocabulary(module)
    mine = {_template(t, slots) for t in _texts(late, 30)}
    for module, count in EARLIER[late]:
        theirs = {_template(t, slots) for t in _texts(module, count)}
        assert not mine & theirs, sorted(mine & theirs)[:5]
