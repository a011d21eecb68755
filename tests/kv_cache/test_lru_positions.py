"""`LruPositions` tells where a block would stand in one LRU free queue.

The oracle is that queue itself (empty blocks to the front, others to the back,
hits and takes removing blocks): after every random operation, every cached
block's position from the model must equal its index in the queue, for rings
large enough to hold every release and for rings that wrap many times (then for
every release still in the ring).
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from hybridkv.kv_cache.eviction.lru_positions import LruPositions


def run(seed: int, capacity: int, steps: int = 1500) -> int:
    rng = random.Random(seed)
    model = LruPositions(capacity)
    queue: OrderedDict[int, tuple[tuple[int, int], bool]] = OrderedDict()  # id -> mark, cached
    held = list(range(100))
    checked = 0
    for _ in range(steps):
        op = rng.random()
        cached = [b for b, (_, c) in queue.items() if c]
        if op < 0.35 and held:  # a release, a few blocks at once, some empty
            free = len(queue)
            for i in range(min(rng.randrange(1, 6), len(held))):
                block = held.pop(rng.randrange(len(held)))
                empty = rng.random() < 0.2
                queue[block] = (model.release(free + i, empty), not empty)
                if empty:
                    queue.move_to_end(block, last=False)
        elif op < 0.6 and cached:  # a hit
            block = rng.choice(cached)
            model.hit(queue.pop(block)[0][0])
            held.append(block)
        elif op < 0.9 and queue:  # blocks taken from the front
            n = rng.randrange(1, min(4, len(queue)) + 1)
            for _ in range(n):
                held.append(queue.popitem(last=False)[0])
            model.taken(n)
        elif cached:  # a block loses its data and goes to the front
            block = rng.choice(cached)
            mark = queue[block][0]
            model.to_front(mark[0])
            queue[block] = (mark, False)
            queue.move_to_end(block, last=False)
        start = model._next - capacity
        for index, (mark, cached_now) in enumerate(queue.values()):
            if cached_now and mark[0] >= start:
                assert model.position(mark) == index
                checked += 1
    return checked


@pytest.mark.parametrize("capacity", [1 << 14, 64, 8])
@pytest.mark.parametrize("seed", range(3))
def test_positions_match_one_lru_queue(seed, capacity):
    assert run(seed, capacity) > 1000  # the comparisons really ran


def test_a_taken_block_has_a_negative_position():
    model = LruPositions(8)
    a, b = model.release(0, False), model.release(1, False)
    model.taken(1)  # a, at the front, is taken
    assert model.position(a) == -1 and model.position(b) == 0
    model.hit(b[0])
    c = model.release(0, False)
    assert model.position(c) == 0


def test_capacity_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        LruPositions(12)
