"""The default eviction policy's five rules, each in a small hand-worked pool state.

Each scenario's expected order is worked out by hand from the rule; each is run
again with that rule switched off (`HybridRules`), to show the rule is what
decides it.
"""

import warnings

import pytest

from hybridkv import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheManager, Request
from hybridkv.kv_cache.block_pool import BlockPool
from hybridkv.kv_cache.eviction import (
    LOW_VALUE,
    PROTECTED,
    HybridPolicy,
    HybridRules,
    register_eviction_policy,
)
from hybridkv.kv_cache.eviction.hybrid import HIT

WITHOUT = {
    "low_value_first": HybridRules(low_value_first=False),
    "hits_kept": HybridRules(hits_kept=False),
    "cycle_guard": HybridRules(cycle_guard=False),
    "cycle_guard-hit_share": HybridRules(cycle_guard=False, hit_share=1.0),
    "protected_last": HybridRules(protected_last=False),
}
for _rule, _rules in WITHOUT.items():
    register_eviction_policy(f"test-hybrid-without-{_rule}",
                             type(f"Without_{_rule}", (HybridPolicy,), {"rules": _rules}))

pytestmark = pytest.mark.both_backends  # each test runs on the C and the Python backend


def policy_name(without):
    return "hybrid" if without is None else f"test-hybrid-without-{without}"


def held_cached(pool, n, tag):
    """n new blocks, held, each caching its own hash."""
    blocks = pool.get_new_blocks(n)
    for i, b in enumerate(blocks):
        pool.cache_block(b, tag + bytes([i]) * 31, 0)
    return blocks


def take_ids(pool, n):
    return [b.block_id for b in pool.get_new_blocks(n)]


def empty_first(without=None):
    pool = BlockPool(4, eviction_policy=policy_name(without))
    a, b = held_cached(pool, 2, b"e")
    c = pool.get_new_blocks(1)[0]  # no cached data
    for block in (a, b, c):
        pool.free_blocks([block])
    order = take_ids(pool, 3)
    pool.check_integrity()
    return order, [c.block_id, b.block_id, a.block_id]


def test_rule_1_empty_blocks_go_first():
    order, (c, b, a) = empty_first()
    # c holds nothing; then the guard (on at the start) takes the newest release first
    assert order == [c, b, a]


def low_value_next(without=None):
    pool = BlockPool(4, eviction_policy=policy_name(without))
    a, b, c = held_cached(pool, 3, b"l")
    b.value_hint = c.value_hint = LOW_VALUE
    c.num_hits = 1  # a hit used it: it proved its value whatever the rating
    pool.free_blocks([c])
    pool.free_blocks([b])
    pool.free_blocks([a])
    order = take_ids(pool, 3)
    pool.check_integrity()
    return order, (a.block_id, b.block_id, c.block_id)


def test_rule_2_low_value_never_hit_blocks_go_next():
    order, (a, b, c) = low_value_next()
    assert order == [b, a, c]  # low value b; never-hit a; c was hit
    order, _ = low_value_next("low_value_first")
    assert order == [a, b, c]  # as any never-hit block: newest release first


def never_hit_before_hit(without=None):
    pool = BlockPool(4, eviction_policy=policy_name(without))
    h, f = held_cached(pool, 2, b"h")
    h.num_hits = 1
    pool.free_blocks([f])  # released first, never hit
    pool.free_blocks([h])
    pool.free_blocks(held_cached(pool, 1, b"n"))  # one more never-hit release
    order = take_ids(pool, 3)
    pool.check_integrity()
    return order, (f.block_id, h.block_id)


def test_rule_3_never_hit_data_goes_before_hit_data():
    order, (f, h) = never_hit_before_hit()
    assert order[1:] == [f, h]  # both never-hit releases, then the hit block
    order, _ = never_hit_before_hit("hits_kept")
    assert order[1:] == [h, f]  # one queue: the hit block was released before f


def hit_share_cap(without):
    pool = BlockPool(11, eviction_policy=policy_name(without))  # 10 blocks: 8 hit at most
    hits = held_cached(pool, 9, b"c")
    for b in hits:
        b.num_hits = 1
        pool.free_blocks([b])  # the ninth hit block pushes the first to the never-hit queue
    late = held_cached(pool, 1, b"g")[0]  # never hit, released after that
    pool.free_blocks([late])
    order = take_ids(pool, 2)
    pool.check_integrity()
    return order, (hits[0].block_id, late.block_id)


def test_rule_3_hit_data_keeps_at_most_its_share_of_the_pool():
    # in LRU order (guard off): the spilled block joined the never-hit queue before `late`
    order, (oldest_hit, late) = hit_share_cap("cycle_guard")
    assert order == [oldest_hit, late]
    order, (oldest_hit, late) = hit_share_cap("cycle_guard-hit_share")
    assert order == [late, oldest_hit]  # uncapped: every hit block after never-hit data


def run_round_robin(policy):
    """Three sessions of 13 tokens (3 full blocks + 1), round robin, 7 usable blocks:
    the hits of each request after the first round."""
    warnings.simplefilter("ignore", RuntimeWarning)  # the repeated-miss warning is expected
    mgr = KVCacheManager(KVCacheConfig(8, [KVCacheGroupSpec(["f"], FullAttentionSpec(4))]),
                         eviction_policy=policy)
    sessions = [[100 * s + t for t in range(12)] for s in range(3)]
    hits = []
    for round_id in range(4):
        for s, tokens in enumerate(sessions):
            req = Request(f"s{s}-{round_id}", tokens + [999])
            blocks, n = mgr.get_computed_blocks(req)
            assert mgr.allocate_slots(req, req.num_tokens - n, n, blocks if n else None)
            req.num_computed_tokens = req.num_tokens
            mgr.free(req)
            hits.append(n)
    mgr.check_integrity()
    return hits[3:]


def test_rule_4_cycle_guard_keeps_one_session_of_a_round_robin_whole():
    # three sessions of 4 blocks, 7 usable blocks, round robin: LRU drops each session
    # just before its turn; with the newest release taken first, session 0 (cached
    # first) stays whole and hits in every round (12 tokens)
    assert run_round_robin("hybrid") == [12, 0, 0] * 3
    assert run_round_robin(policy_name("cycle_guard")) == [0] * 9
    assert run_round_robin("lru") == [0] * 9  # LRU evicts each session before its turn


def test_rule_4_guard_turns_off_when_it_evicts_what_lru_would_have_kept():
    pool = BlockPool(8, eviction_policy="hybrid")  # 7 blocks
    policy = pool.free_queue
    assert policy.is_cycling()  # on at the start
    spare = pool.get_new_blocks(1)[0]  # held, no data yet
    blocks = held_cached(pool, 4, b"r")  # 2 blocks left empty
    pool.free_blocks(blocks[:1])
    pool.free_blocks(blocks[1:2])  # the guard puts this release first
    victim_hash = blocks[1].block_hash
    assert take_ids(pool, 3) == [6, 7, blocks[1].block_id]  # the empty ones, then it
    # its data is computed again now: LRU (empty blocks, then blocks[0], then
    # blocks[1]) would still hold it after 3 blocks taken, so the vote goes to LRU
    pool.cache_block(spare, victim_hash, 0)
    assert not policy.is_cycling()
    for block in (blocks[2], blocks[3], spare):
        pool.free_blocks([block])
    assert take_ids(pool, 2) == [blocks[0].block_id, blocks[2].block_id]  # LRU order
    pool.check_integrity()


def protected_last(without=None):
    pool = BlockPool(3, eviction_policy=policy_name(without))
    kept, hit = held_cached(pool, 2, b"p")
    kept.value_hint = PROTECTED
    hit.num_hits = 1
    pool.free_blocks([kept])
    pool.free_blocks([hit])
    order = take_ids(pool, 2)
    pool.check_integrity()
    return order, (kept.block_id, hit.block_id)


def test_rule_5_protected_blocks_go_last():
    order, (kept, hit) = protected_last()
    assert order == [hit, kept]
    order, _ = protected_last("protected_last")
    assert order == [kept, hit]  # an ordinary never-hit block goes before hit data


def test_recomputing_cached_data_counts_as_a_hit():
    pool = BlockPool(4, eviction_policy="hybrid")
    a, b = held_cached(pool, 2, b"r")
    pool.free_blocks([a, b])
    (c,) = pool.get_new_blocks(1)  # the empty block 3
    assert not pool.cache_block(c, a.block_hash, 0)  # a duplicate: a is reused data
    assert a.num_hits == 1 and a.queue_slot == HIT  # moved to the hit queue (rule 3)
    assert take_ids(pool, 2) == [b.block_id, a.block_id]
    pool.check_integrity()


@pytest.mark.parametrize("field,value", [("hit_share", 1.5), ("vote_weight", 0.0),
                                         ("ghost_pools", 0)])
def test_rules_out_of_range_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        HybridRules(**{field: value})
