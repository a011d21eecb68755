"""The `hybrid` policy's four rules, each in a small exact scenario that fails without it,
and its agreement with `lru` (the oracle) when no block carries a rating."""

import random

import pytest

from hybridkv.kv_cache.block_pool import BlockPool
from hybridkv.kv_cache.eviction import LOW_VALUE, NORMAL_VALUE, PROTECTED


def held_cached(pool, n, tag):
    """n new blocks, held, each caching distinct data."""
    blocks = pool.get_new_blocks(n)
    for i, b in enumerate(blocks):
        pool.cache_block(b, tag + bytes([i]) * 31, 0)
    return blocks


def take_ids(pool, n):
    return [b.block_id for b in pool.get_new_blocks(n)]


def test_rule_1_a_block_with_no_data_goes_first():
    pool = BlockPool(4, eviction_policy="hybrid")
    a, b = held_cached(pool, 2, b"x")
    (c,) = pool.get_new_blocks(1)  # holds no data
    pool.free_blocks([a, b])
    pool.free_blocks([c])  # released last, taken first
    assert take_ids(pool, 3) == [c.block_id, a.block_id, b.block_id]
    pool.check_integrity()


def test_rule_2_a_never_hit_low_value_block_goes_before_older_data():
    pool = BlockPool(4, eviction_policy="hybrid")
    a, b, c = held_cached(pool, 3, b"x")
    pool.free_blocks([a, b])
    c.value_hint = LOW_VALUE  # a window no likely hit resumes from
    pool.free_blocks([c])
    assert take_ids(pool, 3) == [c.block_id, a.block_id, b.block_id]


def test_rule_2_a_low_value_block_a_hit_used_keeps_its_place():
    pool = BlockPool(4, eviction_policy="hybrid")
    a, b, c = held_cached(pool, 3, b"x")
    pool.free_blocks([a, b])
    c.value_hint = LOW_VALUE
    c.num_hits = 1  # proved useful whatever its group thinks
    pool.free_blocks([c])
    assert take_ids(pool, 3) == [a.block_id, b.block_id, c.block_id]


def test_rule_3_a_protected_block_goes_last_and_queues_again_when_rated_again():
    pool = BlockPool(5, eviction_policy="hybrid")
    a, b, c, d = held_cached(pool, 4, b"x")
    a.value_hint = PROTECTED  # released first: LRU would take it first
    pool.free_blocks([a])
    pool.free_blocks([b, c])
    assert [x.block_id for x in pool.free_queue][-1] == a.block_id
    a.value_hint = NORMAL_VALUE  # its request ended: rated again, queued with its release
    pool.free_blocks([d], requeue=[a])
    assert take_ids(pool, 4) == [b.block_id, c.block_id, d.block_id, a.block_id]
    pool.check_integrity()


def test_rule_4_least_recently_used_first_a_release_tail_first():
    pool = BlockPool(6, eviction_policy="hybrid")
    a, b, c, d, e = held_cached(pool, 5, b"x")
    pool.free_blocks([b, a])  # a request returns its blocks tail first
    pool.free_blocks([d, c])
    pool.free_blocks([e])
    pool.touch([b])  # a hit: b is used again, then released last
    pool.free_blocks([b])
    assert take_ids(pool, 5) == [a.block_id, d.block_id, c.block_id, e.block_id, b.block_id]


def random_ops(pool, rng, steps, rated):
    """Random allocate / cache / hit / free traffic; ratings only when `rated`."""
    held: list = []
    order = []
    for step in range(steps):
        op = rng.random()
        if op < 0.4 and pool.num_free_blocks > 2:
            new = pool.get_new_blocks(rng.randint(1, 2))
            order += [b.block_id for b in new]
            for b in new:
                if rng.random() < 0.8:
                    pool.cache_block(b, step.to_bytes(4, "little") + bytes([b.block_id]) * 28, 0)
            held += new
        elif op < 0.55:
            hits = [b for b in pool.free_queue if b.block_hash is not None][:2]
            pool.touch(hits)
            held += hits
        elif held:
            rng.shuffle(held)
            out, held[:] = held[:2], held[2:]
            for b in out:
                if rated and b.ref_cnt == 1 and rng.random() < 0.3:
                    b.value_hint = rng.choice([LOW_VALUE, PROTECTED])
            pool.free_blocks(out)
        pool.check_integrity()
    return order


@pytest.mark.parametrize("seed", range(4))
def test_without_ratings_hybrid_takes_exactly_what_lru_takes(seed):
    """Rule 4's claim: with every block rated NORMAL_VALUE the policy is `lru`."""
    pools = {p: BlockPool(24, eviction_policy=p) for p in ("lru", "hybrid")}
    taken = {p: random_ops(pools[p], random.Random(seed), 300, rated=False) for p in pools}
    assert taken["hybrid"] == taken["lru"]
    assert [b.block_id for b in pools["hybrid"].free_queue] == \
        [b.block_id for b in pools["lru"].free_queue]


@pytest.mark.parametrize("seed", range(4))
def test_rated_traffic_keeps_every_free_block_queued_once(seed):
    pool = BlockPool(24, eviction_policy="hybrid")
    random_ops(pool, random.Random(seed), 300, rated=True)
    queued = [b.block_id for b in pool.free_queue]
    assert len(queued) == len(set(queued)) == pool.num_free_blocks
    for b in pool.free_queue:
        assert b in pool.free_queue
