"""The C queues of `hybrid` (HybridCore) decide exactly like the Python reference
(HybridQueues) on random traffic, and refuse bad calls without changing anything."""

import random

import pytest

from hybridkv.kv_cache.eviction import JUNCTION, LOW_VALUE, NORMAL_VALUE, PROTECTED
from hybridkv.kv_cache.eviction.hybrid import QUEUE_RATINGS, HybridQueues
from hybridkv.kv_cache.fastpath import native

pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built")
RATINGS = [LOW_VALUE, NORMAL_VALUE, JUNCTION, PROTECTED]


def make(kind, n):
    blocks = [native.Block(i) for i in range(1, n + 1)]
    cls = native.HybridCore if kind == "c" else HybridQueues
    return cls(blocks, QUEUE_RATINGS), blocks


def step(policy, blocks, held, rng, step_no):
    """One random operation; returns what it decided (ids), the same for both sides."""
    op = rng.random()
    free = [b for b in blocks if b in policy]
    if op < 0.35 and free:
        taken = policy.take(rng.randint(1, min(3, len(free))))
        for b in taken:
            b.block_hash = None if rng.random() < 0.2 else bytes([step_no % 256, b.block_id])
            b.num_hits, b.value_hint = 0, NORMAL_VALUE
        held.extend(taken)
        return ("take", [b.block_id for b in taken])
    if op < 0.5 and free:
        hit = sorted(rng.sample(free, min(2, len(free))), key=lambda b: b.block_id)
        policy.remove_blocks(hit)
        for b in hit:
            b.num_hits += 1
        held.extend(hit)
        return ("hit", [b.block_id for b in hit])
    if op < 0.6 and free:
        b = min(free, key=lambda b: b.block_id)
        if rng.random() < 0.5:
            b.value_hint = rng.choice(RATINGS)
            policy.hint_changed(b)
        elif b.block_hash is not None:
            b.block_hash = None
            policy.uncache(b)
        return ("rate", b.block_id)
    out = sorted(held, key=lambda b: b.block_id)[:rng.randint(0, 3)]
    for b in out:
        held.remove(b)
        b.value_hint = rng.choice(RATINGS)
    rng.shuffle(out)
    policy.add_free(out)
    return ("free", [b.block_id for b in out])


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_decide_alike(seed):
    sides = {k: make(k, 20) for k in ("c", "py")}
    held = {k: [] for k in sides}
    rngs = {k: random.Random(seed) for k in sides}
    for i in range(400):
        decided = {k: step(*sides[k], held[k], rngs[k], i) for k in sides}
        assert decided["c"] == decided["py"], i
        order = {k: [(b.block_id, b.queue_slot) for b in sides[k][0]] for k in sides}
        assert order["c"] == order["py"], i
        assert len(sides["c"][0]) == len(sides["py"][0])


def test_bad_calls_raise_and_change_nothing():
    policy, blocks = make("c", 4)
    before = [b.block_id for b in policy]
    with pytest.raises(ValueError):
        policy.add_free([blocks[0]])  # already free
    with pytest.raises(ValueError):
        policy.take(5)
    taken = policy.take(1)
    with pytest.raises(KeyError):
        policy.remove_blocks([blocks[1], taken[0]])  # the second is not free
    with pytest.raises(ValueError):
        policy.add_free([taken[0], taken[0]])  # given twice
    assert [b.block_id for b in policy] == before[1:] and len(policy) == 3


def test_ratings_come_from_the_named_structure():
    policy, blocks = make("c", 2)
    a, b = policy.take(2)
    a.block_hash, b.block_hash = b"a", b"b"
    a.value_hint = PROTECTED
    policy.add_free([a, b])
    assert [x.block_id for x in policy] == [b.block_id, a.block_id]
    with pytest.raises(AttributeError):
        native.HybridCore([], (0, 3))  # a positional tuple is refused
