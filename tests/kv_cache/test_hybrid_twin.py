"""The C twin of the `hybrid` policy (`_fastpath.HybridRulesCore`) decides exactly like
the Python reference (`eviction.hybrid.HybridPolicy`, which the Python backend runs).

Random operation sequences, as a pool makes them (take, free, hit, re-rate, queue
anew, uncache, recompute), run on both with their own copies of the same blocks;
after every operation the free blocks in eviction order, the count, every block's
queue, the remembered evictions and the cycle guard must be equal. The rules
include settings where the hit cap spills and the votes swing often, and each rule
switched off.
"""

from __future__ import annotations

import random

import pytest

from hybridkv.kv_cache import fastpath
from hybridkv.kv_cache.block_pool import BlockPool
from hybridkv.kv_cache.eviction import (
    JUNCTION,
    LOW_VALUE,
    NORMAL_VALUE,
    PROTECTED,
    HybridPolicy,
    HybridRules,
)

RATINGS = (LOW_VALUE, NORMAL_VALUE, NORMAL_VALUE, JUNCTION, PROTECTED)
RULES = [
    HybridRules(),
    HybridRules(hit_share=0.25, vote_weight=0.5, ghost_pools=1),  # spills, fast swings
    HybridRules(hit_share=0.0, vote_weight=0.3),  # every hit block spills at once
    HybridRules(low_value_first=False, protected_last=False),
    HybridRules(hits_kept=False, vote_weight=0.4),
    HybridRules(cycle_guard=False, hit_share=0.5),
]


def make_pair(rules: HybridRules, num_blocks: int) -> list:
    """[(C twin, its blocks), (Python reference, its blocks)], the same pool state."""
    cls = type("Rules", (HybridPolicy,), {"rules": rules})
    sides = []
    for backend in ("c", "python"):
        blocks = [fastpath.native.Block(i) for i in range(num_blocks)]
        sides.append((cls.for_backend(backend)(blocks), blocks))
    assert isinstance(sides[0][0], fastpath.native.HybridRulesCore)
    assert not isinstance(sides[1][0], fastpath.native.HybridRulesCore)
    assert all(isinstance(policy, cls) for policy, _ in sides)
    return sides


class Twin:
    """The same pool state on the C twin and on the Python reference."""

    def __init__(self, sides: list, rng: random.Random) -> None:
        self.rng, self.sides = rng, sides
        self.held: set[int] = set()
        self.num_hashes = 0
        self.free = set(range(len(sides[0][1])))

    def each_block(self, i: int, **fields) -> None:
        for _, blocks in self.sides:
            for name, value in fields.items():
                setattr(blocks[i], name, value)

    def call(self, method: str, ids: list[int]) -> None:
        for policy, blocks in self.sides:
            getattr(policy, method)([blocks[i] for i in ids])

    def check(self) -> None:
        (c, c_blocks), (py, py_blocks) = self.sides
        assert len(c) == len(py) == len(self.free)
        assert [b.block_id for b in c] == [b.block_id for b in py]
        assert [b.queue_slot for b in c_blocks] == [b.queue_slot for b in py_blocks]
        assert list(c.evicted) == list(py.evicted)
        assert c.is_cycling() == py.is_cycling()
        for i in self.rng.sample(range(len(c_blocks)), min(3, len(c_blocks))):
            assert (c_blocks[i] in c) == (py_blocks[i] in py) == (i in self.free)

    def step(self) -> None:
        op, free = self.rng.random(), bool(self.free)
        if op < 0.3 and free:
            self.take()
        elif op < 0.55 and self.held:
            self.release()
        elif op < 0.7 and free:
            self.hit()
        elif op < 0.75 and free:
            self.rerate()
        elif op < 0.8 and free:
            self.requeue()
        elif op < 0.88 and free:
            self.uncache()
        else:
            self.recompute()

    def new_hash(self) -> bytes | None:
        """None (no data cached), data seen before, or new data."""
        kind = self.rng.random()
        if kind < 0.2:
            return None
        if kind < 0.4:
            return self.rng.randrange(max(self.num_hashes, 1)).to_bytes(8, "little")
        self.num_hashes += 1
        return self.num_hashes.to_bytes(8, "little")

    def take(self, n: int | None = None) -> None:
        if n is None:
            n = min(self.rng.choice([1, 1, 1, 2, 5, len(self.free)]), len(self.free))
        c_out, py_out = [policy.take(n) for policy, _ in self.sides]
        ids = [b.block_id for b in py_out]
        assert [b.block_id for b in c_out] == ids
        for i in ids:  # new data, as the pool resets a block it hands out
            self.each_block(i, num_hits=0, value_hint=NORMAL_VALUE, block_hash=self.new_hash(),
                            ref_cnt=1)
        self.free.difference_update(ids)
        self.held.update(ids)

    def release(self, fresh: bool = False, ids: list[int] | None = None) -> None:
        if ids is None:
            ids = self.rng.sample(sorted(self.held), self.rng.randint(1, min(6, len(self.held))))
        for i in ids:
            self.each_block(i, num_hits=0 if fresh else self.rng.choice([0, 0, 1, 2, 3]),
                            value_hint=NORMAL_VALUE if fresh else self.rng.choice(RATINGS),
                            ref_cnt=0)
        self.call("add_free", ids)
        self.held.difference_update(ids)
        self.free.update(ids)

    def hit(self) -> None:
        ids = self.rng.sample(sorted(self.free), self.rng.randint(1, min(4, len(self.free))))
        for i in ids:  # the pool takes the reference first
            self.each_block(i, ref_cnt=1)
        self.call("remove_blocks", ids)
        for i in ids:
            self.each_block(i, num_hits=self.sides[1][1][i].num_hits + 1)
        self.free.difference_update(ids)
        self.held.update(ids)

    def requeue(self) -> None:
        """Free blocks whose rating changed queued anew, after the blocks of a release
        (as `BlockPool.free_blocks` does with `requeue`)."""
        ids = self.rng.sample(sorted(self.free), self.rng.randint(1, min(3, len(self.free))))
        released = self.rng.sample(sorted(self.held), min(len(self.held), self.rng.randint(0, 3)))
        self.call("remove_blocks", ids)
        for i in ids:
            self.each_block(i, value_hint=self.rng.choice(RATINGS))
        for i in released:
            self.each_block(i, num_hits=self.rng.choice([0, 0, 1]), value_hint=NORMAL_VALUE,
                            ref_cnt=0)
        self.call("add_free", released + ids)
        self.held.difference_update(released)
        self.free.update(released)

    def rerate(self) -> None:
        i = self.rng.choice(sorted(self.free))
        self.each_block(i, num_hits=self.rng.choice([0, 1, 2]),
                        value_hint=self.rng.choice(RATINGS))
        for policy, blocks in self.sides:
            policy.hint_changed(blocks[i])

    def uncache(self) -> None:
        i = self.rng.choice(sorted(self.free))
        self.each_block(i, block_hash=None)
        for policy, blocks in self.sides:
            policy.uncache(blocks[i])

    def recompute(self) -> None:
        evicted = list(self.sides[1][0].evicted)
        if evicted:
            h = self.rng.choice(evicted)
            for policy, _ in self.sides:
                policy.recomputed(h)


@pytest.mark.parametrize("rules", RULES, ids=range(len(RULES)))
@pytest.mark.parametrize("seed", range(4))
def test_random_operations_decide_alike(native, rules, seed):
    rng = random.Random(seed)
    twin = Twin(make_pair(rules, rng.choice([3, 12, 40])), rng)
    twin.check()
    for _ in range(500):
        twin.step()
        twin.check()


@pytest.mark.parametrize("seed", range(2))
def test_many_evictions_decide_alike(native, seed):
    # a pool larger than the watch's first ring, new data evicted and computed again
    # often: the remembered evictions grow, are trimmed and compacted along the way
    rng = random.Random(seed)
    twin = Twin(make_pair(RULES[seed], 150), rng)
    for _ in range(3000):
        if rng.random() < 0.8:
            if twin.free and (rng.random() < 0.5 or not twin.held):
                twin.take()
            else:
                twin.release(fresh=True)
        elif rng.random() < 0.6:
            twin.recompute()
        else:
            twin.step()
        twin.check()


def state(policy, blocks) -> tuple:
    return ([b.block_id for b in policy], [b.queue_slot for b in blocks], list(policy.evicted),
            len(policy), policy.is_cycling())


def test_bad_calls_raise_and_change_nothing(native):
    twin = Twin(make_pair(RULES[0], 6), random.Random(0))
    twin.take(3)
    twin.release(ids=[0])
    c, blocks = twin.sides[0]
    before = state(c, blocks)
    held, free = blocks[1], blocks[0]
    for call, arg, error in [
        (c.remove_blocks, [free, held], KeyError),  # one of them is not free
        (c.remove, held, KeyError),
        (c.add_free, [held, held], ValueError),  # given twice
        (c.add_free, [held, free], ValueError),  # free already
        (c.add_free, [held, "x"], ValueError),
        (c.uncache, held, KeyError),
        (c.hint_changed, held, KeyError),
        (c.recomputed, b"never evicted", KeyError),
        (c.take, len(c) + 1, ValueError),
        (c.take, -1, ValueError),
    ]:
        with pytest.raises(error):
            call(arg)
        assert state(c, blocks) == before, call


@pytest.mark.parametrize("field,value", [("hit_share", 1.5), ("vote_weight", 1.0),
                                         ("ghost_pools", 0)])
def test_rules_out_of_range_are_refused_by_the_c_too(native, field, value):
    rules = HybridRules()
    object.__setattr__(rules, field, value)  # past HybridRules' own check
    with pytest.raises(ValueError, match=field):
        native.HybridRulesCore([native.Block(0)], rules)


def test_a_subclass_that_changes_a_method_runs_in_python(native):
    class Mine(HybridPolicy):
        def take(self, num_blocks):
            return super().take(num_blocks)

    class Tuned(HybridPolicy):
        rules = HybridRules(hit_share=0.5)

    blocks = [native.Block(i) for i in range(4)]
    assert not isinstance(Mine.for_backend("c")(blocks[:2]), native.HybridRulesCore)  # its take
    tuned = Tuned.for_backend("c")(blocks[2:])
    assert isinstance(tuned, native.HybridRulesCore) and isinstance(tuned, Tuned)


@pytest.mark.parametrize("backend", ["c", "python"])
def test_the_pools_backend_picks_the_policy_it_runs(native, backend):
    pool = BlockPool(4, eviction_policy="hybrid", backend=backend)
    assert isinstance(pool.free_queue, HybridPolicy)
    assert isinstance(pool.free_queue, native.HybridRulesCore) == (backend == "c")
