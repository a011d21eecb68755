"""The C tiers of the hybrid policy (`_fastpath.HybridCore`) decide exactly like the
Python reference (`eviction.hybrid.HybridTiers`).

Random operation sequences, as a pool makes them (take, free, hit, re-rate,
queue anew, uncache, recompute), run on both with their own copies of the same blocks; after
every operation the free blocks in eviction order, the count, every block's tier
and the watched evictions must be equal. The rules' constants include settings
where aging and the stale-data rule trigger often.
"""

from __future__ import annotations

import random

import pytest

from hybridkv.kv_cache.eviction import JUNCTION, LOW_VALUE, NORMAL_VALUE, PROTECTED
from hybridkv.kv_cache.eviction import tiers as hybrid_eviction
from hybridkv.kv_cache.eviction.tiers import HybridTiers, TierRules

RATINGS = (LOW_VALUE, NORMAL_VALUE, NORMAL_VALUE, JUNCTION, PROTECTED)
RULES = [
    hybrid_eviction.TIER_RULES,
    TierRules(age_every=2, stale_age=1.5, reuse_decay=0.999, return_gate=0.0,
              return_weight=0.25, vote_weight=0.25, vote_back=4.0,
              ghost_pools=1),  # the stale rule is on once a hit was seen
    TierRules(age_every=3, stale_age=0.5, reuse_decay=1.0, return_gate=0.2,
              return_weight=0.5, vote_weight=0.5, vote_back=0.5,
              ghost_pools=2),  # votes swing LRU order on and off quickly
]


class Twin:
    """The same pool state on the C tiers and on the Python reference."""

    def __init__(self, native, num_blocks: int, rules, rng: random.Random) -> None:
        self.rng = rng
        self.sides = []
        for make in (native.HybridCore, HybridTiers):
            blocks = [native.Block(i) for i in range(num_blocks)]
            self.sides.append((make(blocks, rules), blocks))
        self.held: set[int] = set()
        self.num_hashes = 0
        self.free = set(range(num_blocks))

    def each_block(self, i: int, **fields) -> None:
        for _, blocks in self.sides:
            for name, value in fields.items():
                setattr(blocks[i], name, value)

    def call(self, method: str, ids: list[int]) -> list:
        return [getattr(policy, method)([blocks[i] for i in ids]) for policy, blocks in self.sides]

    def check(self) -> None:
        (c, c_blocks), (py, py_blocks) = self.sides
        assert len(c) == len(py) == len(self.free)
        assert [b.block_id for b in c] == [b.block_id for b in py]
        assert [b.queue_slot for b in c_blocks] == [b.queue_slot for b in py_blocks]
        assert list(c.evicted) == list(py.evicted)
        for i in self.rng.sample(range(len(c_blocks)), 3):
            assert (c_blocks[i] in c) == (py_blocks[i] in py) == (i in self.free)

    def step(self) -> None:
        op = self.rng.random()
        if op < 0.3 and self.free:
            self.take()
        elif op < 0.55 and self.held:
            self.release()
        elif op < 0.7 and self.free:
            self.hit()
        elif op < 0.75 and self.free:
            self.rerate()
        elif op < 0.8 and self.free:
            self.requeue()
        elif op < 0.88 and self.free:
            i = self.rng.choice(sorted(self.free))
            self.each_block(i, block_hash=None)
            for policy, blocks in self.sides:
                policy.uncache(blocks[i])
        else:
            self.recompute()

    def recompute(self) -> None:
        watched = list(self.sides[1][0].evicted)
        if watched:
            h = self.rng.choice(watched)
            for policy, _ in self.sides:
                policy.recomputed(h)

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


@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_decide_alike(native, rules, seed):
    rng = random.Random(seed)
    twin = Twin(native, rng.choice([3, 12, 40]), rules, rng)
    twin.check()
    for _ in range(600):
        twin.step()
        twin.check()


@pytest.mark.parametrize("seed", range(3))
def test_many_watched_evictions_decide_alike(native, seed):
    # a pool larger than the watch's first ring, fresh data evicted and recomputed often:
    # the ring grows and is compacted along the way
    rng = random.Random(seed)
    twin = Twin(native, 150, RULES[seed % len(RULES)], rng)
    for _ in range(4000):
        if rng.random() < 0.8:  # mostly new data that is never hit
            if twin.free and (rng.random() < 0.5 or not twin.held):
                twin.take()
            else:
                twin.release(fresh=True)
        elif rng.random() < 0.5 + 0.2 * seed:  # the watch with more or fewer holes
            twin.recompute()
        else:
            twin.step()
        twin.check()


def test_the_watch_keeps_its_order_through_holes(native):
    # every round evicts a pool of new data, then all but the oldest few watched hashes
    # are computed again: the watch fills with holes behind them and is compacted
    twin = Twin(native, 40, RULES[0], random.Random(1))
    for round_ in range(16):
        twin.take(len(twin.free))
        twin.release(fresh=True, ids=sorted(twin.held))
        for h in list(twin.sides[1][0].evicted)[1 + round_ % 3:]:
            for policy, _ in twin.sides:
                policy.recomputed(h)
        twin.check()


def test_bad_calls_raise_and_change_nothing(native):
    twin = Twin(native, 4, RULES[0], random.Random(0))
    c, c_blocks = twin.sides[0]
    before = [b.block_id for b in c]
    with pytest.raises(ValueError):
        c.add_free([c_blocks[0]])  # already free
    with pytest.raises(KeyError):
        c.remove_blocks([c_blocks[1], c_blocks[1]])  # given twice
    with pytest.raises(ValueError):
        c.take(5)
    with pytest.raises(KeyError):
        c.recomputed(b"never evicted")
    assert [b.block_id for b in c] == before and len(c) == 4
