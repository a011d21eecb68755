"""The tiered eviction policy (the former default) in small exact scenarios:
which block goes first and why."""

import functools
import random

import pytest

from hybridkv import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheManager, Request
from hybridkv.kv_cache.block_pool import BlockPool
from hybridkv.kv_cache.eviction import (
    EVICTION_POLICIES,
    JUNCTION,
    LOW_VALUE,
    NORMAL_VALUE,
    PROTECTED,
    EvictionPolicy,
)
from hybridkv.kv_cache.eviction import tiers as hybrid_eviction


def cached(pool, ids, tag):
    blocks = [pool.blocks[i] for i in ids]
    for i, b in enumerate(blocks):
        pool.cache_block(b, tag + bytes([i]) * 31, 0)
    return blocks


def take_ids(pool, n):
    return [b.block_id for b in pool.get_new_blocks(n)]


def test_tier_order_empty_low_value_fresh_hit_once_hit_often():
    pool = BlockPool(9, eviction_policy="tiered")
    blocks = pool.get_new_blocks(8)  # ids 1..8, all held
    often, once, fresh_old, fresh_new, low = [1, 2], [3], [4, 5], [6], [7]
    for ids, tag in ((often, b"o"), (once, b"n"), (fresh_old, b"f"), (fresh_new, b"g"),
                     (low, b"l")):
        cached(pool, ids, tag)
    pool.blocks[1].num_hits = pool.blocks[2].num_hits = 2
    pool.blocks[3].num_hits = 1
    pool.blocks[7].value_hint = LOW_VALUE
    # release in this order: often (LRU 1 then 2), once, the older fresh request
    # (tail 5 first), the newer fresh request, the low-value block, an uncached block
    for group in ([pool.blocks[1]], [pool.blocks[2]], [pool.blocks[3]],
                  [pool.blocks[5], pool.blocks[4]], [pool.blocks[6]], [pool.blocks[7]],
                  [blocks[7]]):
        pool.free_blocks(group)
    # uncached 8; low-value 7; fresh newest release first (6), then 5, 4 (tail first);
    # then hit once (3); then hit often, least recently released first (1, 2)
    assert take_ids(pool, 8) == [8, 7, 6, 5, 4, 3, 1, 2]
    pool.check_integrity()


def test_a_hit_block_keeps_its_value_whatever_its_group_rated_it():
    pool = BlockPool(4, eviction_policy="tiered")
    a, b, c = pool.get_new_blocks(3)
    cached(pool, [1, 2, 3], b"x")
    a.value_hint = b.value_hint = LOW_VALUE
    a.num_hits = 1  # reused by a hit before its group released it
    pool.free_blocks([a, b, c])
    assert take_ids(pool, 3) == [2, 3, 1]  # low value, fresh, then the one that was hit


def test_junction_rating_counts_as_one_hit():
    pool = BlockPool(3, eviction_policy="tiered")
    window, plain = pool.get_new_blocks(2)
    cached(pool, [1, 2], b"j")
    window.value_hint = JUNCTION
    pool.free_blocks([plain])
    pool.free_blocks([window])  # released last, but protected like a block hit once
    assert take_ids(pool, 2) == [2, 1]


def test_aging_moves_unused_protected_blocks_down():
    age = hybrid_eviction.AGE_EVERY
    pool = BlockPool(2 + 2 * age, eviction_policy="tiered")
    held = pool.get_new_blocks(1 + age)
    old, fresh = held[0], held[1:]
    cached(pool, [b.block_id for b in held], b"a")
    old.num_hits = 1
    pool.free_blocks([old])
    assert old.queue_slot == hybrid_eviction.HIT_ONCE
    pool.get_new_blocks(age)  # taken from the empty tier: no data lost, no aging
    assert old.queue_slot == hybrid_eviction.HIT_ONCE
    pool.free_blocks(fresh)
    pool.get_new_blocks(age)  # evicts `age` never-hit blocks: the hit-once block ages
    assert old.queue_slot == hybrid_eviction.FRESH
    assert old.block_hash is not None  # demoted, not evicted


def test_low_value_blocks_do_not_age_protected_ones():
    age = hybrid_eviction.AGE_EVERY
    pool = BlockPool(2 + age, eviction_policy="tiered")
    held = pool.get_new_blocks(1 + age)
    old, low = held[0], held[1:]
    cached(pool, [b.block_id for b in held], b"w")
    old.num_hits = 1
    for b in low:  # e.g. window blocks no likely hit needs
        b.value_hint = LOW_VALUE
    pool.free_blocks(held)
    assert pool.get_new_blocks(age) == low
    assert old.queue_slot == hybrid_eviction.HIT_ONCE


def test_recomputing_cached_data_counts_as_a_use():
    pool = BlockPool(4, eviction_policy="tiered")
    a, b = pool.get_new_blocks(2)
    cached(pool, [1], b"r")
    pool.cache_block(b, b"s" * 32, 0)
    pool.free_blocks([a, b])
    (c,) = pool.get_new_blocks(1)  # the empty block 3
    assert not pool.cache_block(c, a.block_hash, 0)  # a duplicate: a is reused data
    assert a.num_hits == 1 and a.queue_slot == hybrid_eviction.HIT_ONCE
    assert take_ids(pool, 2) == [2, 1]


def run_round_robin(policy):
    """Three sessions of 13 tokens (3 full blocks + 1), round robin, 7 usable blocks."""
    import warnings

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
    return hits[3:]  # after the first round


def test_cyclic_sessions_thrash_lru_but_not_hybrid():
    # LRU evicts each session just before its turn comes back: no hit ever
    assert run_round_robin("lru") == [0] * 9
    # hybrid: the newest never-hit release is evicted first, so session 0, cached
    # first, stays whole (4 of the 7 blocks are needed to compute a session) and
    # hits every round; once hit, it is protected
    assert run_round_robin("tiered") == [12, 0, 0] * 3


def test_take_gets_blocks_that_aging_moves_into_an_emptied_tier():
    age = hybrid_eviction.AGE_EVERY
    pool = BlockPool(age + 2, eviction_policy="tiered")
    blocks = pool.get_new_blocks(age + 1)
    cached(pool, [b.block_id for b in blocks], b"t")
    protected = blocks[-1]
    protected.num_hits = 1
    pool.free_blocks(blocks)  # age fresh blocks, one hit-once block
    # taking every fresh block ages the hit-once block into the (now empty) fresh tier;
    # the last block asked for must come from there
    taken = pool.get_new_blocks(age + 1)
    assert len(taken) == age + 1 and taken[-1] is protected
    assert pool.num_free_blocks == 0
    pool.check_integrity()


def stale_scenario(monkeypatch, data_comes_back, idle_takes, defaults=False, late_hit=None,
                   weight=0.5, old_fresh=False):
    """Hit blocks a and b (a released first), a fresh block g; the fresh tier has
    lost a block `f` whose data is (or is not) computed again; the clock then runs
    `idle_takes` blocks (an uncached block taken and freed). With `late_hit` (a
    rating), a block j hit once, released with a, is hit again after the idle
    blocks (a long reuse distance) and kept. Returns the order a, b, g are taken
    in. `defaults`: the module's STALE_AGE and RETURN_GATE, else 2.0 and 0.35; one
    returning block makes `weight` of the share of fresh evictions that came back.
    `old_fresh`: a fresh block o is released with b's second release (below g in the
    fresh stack) and the order of a, b, g, o is returned. The LRU votes are off (LRU
    would still hold f when it comes back: they are tested below)."""
    patch = [("RETURN_WEIGHT", weight), ("REUSE_DECAY", 1.0), ("VOTE_WEIGHT", 0.0)]
    if not defaults:
        patch += [("RETURN_GATE", 0.35), ("STALE_AGE", 2.0)]
    rules = hybrid_eviction.TIER_RULES._replace(**{name.lower(): value for name, value in patch})
    monkeypatch.setattr(hybrid_eviction, "TIER_RULES", rules)
    pool = BlockPool(10, eviction_policy="tiered")
    held = pool.get_new_blocks(9)  # the clock is at 9
    a, b, f, g, spare, e, j = held[0], held[1], held[2], held[3], held[4], held[7], held[8]
    cached(pool, [blk.block_id for blk in held[:7]] + [j.block_id], b"s")
    a.num_hits = b.num_hits = j.num_hits = 1
    pool.free_blocks([a])
    if late_hit is not None:
        j.value_hint = late_hit
        pool.free_blocks([j])
    pool.free_blocks([b])
    f_hash = f.block_hash
    pool.free_blocks([f])
    assert pool.get_new_blocks(1) == [f]  # never-hit data evicted; the policy watches it
    if data_comes_back:
        pool.free_blocks([spare])  # spare's data gives way to f's, computed again
        pool.evict_blocks([spare.block_id])
        assert pool.get_new_blocks(1) == [spare]
        assert pool.cache_block(spare, f_hash, 0)
    pool.touch([b])  # a hit after 1-2 blocks: the longest reuse distance
    pool.free_blocks([b])
    o = held[5]
    if old_fresh:
        pool.free_blocks([o])
    for _ in range(idle_takes):
        pool.free_blocks([e])
        assert pool.get_new_blocks(1) == [e]
    if late_hit is not None:
        pool.touch([j])
    pool.free_blocks([g])
    names = {a: "a", b: "b", g: "g", o: "o"}
    order = [names[blk] for blk in pool.get_new_blocks(4 if old_fresh else 3)]
    pool.check_integrity()
    return order


def test_stale_hit_blocks_go_before_fresh_data_that_keeps_coming_back(monkeypatch):
    # fresh data came back and a, b went unused for more than 2 reuse distances
    assert stale_scenario(monkeypatch, True, 6) == ["a", "b", "g"]


def test_stale_rule_is_off_while_evicted_fresh_data_does_not_come_back(monkeypatch):
    assert stale_scenario(monkeypatch, False, 6) == ["g", "a", "b"]


def test_recently_used_hit_blocks_are_not_stale(monkeypatch):
    # the rule is on, but a and b were released too recently to count as stale
    assert stale_scenario(monkeypatch, True, 0) == ["g", "a", "b"]


def test_hit_blocks_unused_for_one_and_a_half_reuse_distances_are_stale(monkeypatch):
    # b's hit came 2 blocks after its release; a and b are released at clocks 9 and 10
    # (the clock counts blocks taken); one block in five of the fresh evictions came back
    run = functools.partial(stale_scenario, monkeypatch, True, defaults=True, weight=0.2)
    assert run(1) == ["g", "a", "b"]
    assert run(2) == ["a", "g", "b"]  # only a is older than 1.5 reuse distances
    assert run(3) == ["a", "b", "g"]


def test_stale_never_hit_data_goes_before_the_newest_release(monkeypatch):
    # o, never hit, was released as long ago as b: while the rule is on it goes after
    # the stale hit blocks but before g, the newest release; otherwise newest first
    run = functools.partial(stale_scenario, monkeypatch, old_fresh=True)
    assert run(True, 6) == ["a", "b", "o", "g"]
    assert run(False, 6) == ["g", "o", "a", "b"]
    assert run(True, 0) == ["g", "o", "a", "b"]  # not stale yet


def test_a_junction_hit_late_does_not_stretch_the_reuse_distance(monkeypatch):
    # j waited 9 blocks for its hit: as plain data that is the reuse distance and a, b
    # are not stale; a junction's hit comes when a new prefix branches off, on a clock
    # of its own, and does not count
    run = functools.partial(stale_scenario, monkeypatch, True, 6, defaults=True)
    assert run(late_hit=NORMAL_VALUE) == ["g", "a", "b"]
    assert run(late_hit=JUNCTION) == ["a", "b", "g"]


def lru_vote_scenario(comes_back, hit=None):
    """Three hit-once blocks h1..h3 and a never-hit block x are released (x with 3
    blocks free ahead of it); x is taken at once (the newest never-hit release), where
    one LRU queue would have taken h1. If x's data is computed again (`comes_back`),
    LRU would still have held it (2 blocks ahead of it): a vote for LRU order. With
    `hit="h1"`, h1 is then hit: LRU would have lost it, a vote for the tiers; h2
    (`hit="h2"`) LRU would still hold, no vote. Then a never-hit block n is released;
    returns the id taken next."""
    pool = BlockPool(8, eviction_policy="tiered")
    held = pool.get_new_blocks(7)  # ids 1..7; 7 blocks accessed
    cached(pool, [b.block_id for b in held], b"v")
    h1, h2, h3, x, n = held[:5]
    for b in (h1, h2, h3):
        b.num_hits = 1
        pool.free_blocks([b])
    x_hash = x.block_hash
    pool.free_blocks([x])
    assert pool.get_new_blocks(1) == [x]  # the never-hit tier first
    if comes_back:
        assert pool.cache_block(x, x_hash, 0)  # the policy remembers x's hash
    if hit is not None:
        pool.touch([{"h1": h1, "h2": h2}[hit]])
    pool.free_blocks([n])
    taken = take_ids(pool, 1)
    pool.check_integrity()
    return taken[0]


def test_lru_order_while_lru_would_have_kept_more():
    # no evidence: the newest never-hit release goes first
    assert lru_vote_scenario(comes_back=False) == 5
    # x came back while LRU would still have held it: least recently released first
    # over the never-hit bottom and the hit tiers, so h1 (released first) goes
    assert lru_vote_scenario(comes_back=True) == 1
    # a hit LRU would not have missed is no vote: still LRU order, h1 goes
    assert lru_vote_scenario(comes_back=True, hit="h2") == 1
    # a hit LRU would have missed outweighs it (the older vote has decayed): the tiers
    assert lru_vote_scenario(comes_back=True, hit="h1") == 5


def churn_scenario(churn):
    """A hit-once block h1, then a never-hit block x (1 block free ahead of it) are
    released; three times a block is released and taken again (`churn`: "empty", a
    block caching nothing, which LRU puts in front, or "cached", new data, which LRU
    queues behind x); then x is taken (the newest never-hit release) and its data is
    computed again; a never-hit block n is released. Returns the id taken next."""
    pool = BlockPool(8, eviction_policy="tiered")
    held = pool.get_new_blocks(7)  # ids 1..7
    h1, x, c, n = held[0], held[1], held[2], held[3]
    cached(pool, [h1.block_id, x.block_id, n.block_id], b"w")
    h1.num_hits = 1
    pool.free_blocks([h1])
    pool.free_blocks([x])
    x_hash = x.block_hash
    for i in range(3):
        if churn == "cached":
            assert pool.cache_block(c, b"k" + bytes([i]) * 31, 0)
        pool.free_blocks([c])
        assert pool.get_new_blocks(1) == [c]
    assert pool.get_new_blocks(1) == [x]
    assert pool.cache_block(x, x_hash, 0)
    pool.free_blocks([n])
    taken = take_ids(pool, 1)
    pool.check_integrity()
    return taken[0]


def test_empty_blocks_released_go_before_what_lru_would_keep():
    # empty blocks go to the front of an LRU queue, so taking them moves nothing: LRU
    # would still hold x when it comes back, a vote for LRU order (h1, released first)
    assert churn_scenario("empty") == 1
    # new data queues behind x: the three takes would have taken h1 and x under LRU,
    # no vote, the tiers' order (the newest never-hit release, n)
    assert churn_scenario("cached") == 4


def lru_order_scenario(pool_size, before_x, after_x=()):
    """Puts the policy in LRU order: two blocks kept for a running request are released
    (the last ids but one), then the releases in `before_x` (lists of (id, num_hits,
    rating), one list per release), then never-hit x (the last id), which is taken at
    once and its data computed again while one LRU queue would still hold it (two kept
    blocks ahead of it). Then the releases in `after_x`, no take between them. Returns
    the pool and its blocks by id."""
    pool = BlockPool(pool_size, eviction_policy="tiered")
    held = pool.get_new_blocks(pool_size - 1)  # ids 1..pool_size-1, all held
    cached(pool, [b.block_id for b in held], b"q")
    x = held[-1]

    def release(blocks):
        for b, hits, rating in blocks:
            b.num_hits, b.value_hint = hits, rating
        pool.free_blocks([b for b, _, _ in blocks])

    release([(held[-3], 0, PROTECTED), (held[-2], 0, PROTECTED)])
    for blocks in before_x:
        release([(held[i - 1], hits, rating) for i, hits, rating in blocks])
    x_hash = x.block_hash
    pool.free_blocks([x])
    assert pool.get_new_blocks(1) == [x]  # the newest never-hit release
    assert pool.cache_block(x, x_hash, 0)  # back: LRU would still have held it
    for blocks in after_x:
        release([(held[i - 1], hits, rating) for i, hits, rating in blocks])
    return pool, {b.block_id: b for b in held}


def test_lru_order_is_the_order_lru_would_take():
    # a release given tail first (3, 2, 1: the order to evict them) goes tail first, as
    # under LRU, not from its head (the bottom of the never-hit stack)
    pool, _ = lru_order_scenario(10, [[(3, 0, NORMAL_VALUE), (2, 0, NORMAL_VALUE),
                                      (1, 0, NORMAL_VALUE)]])
    assert take_ids(pool, 3) == [3, 2, 1]
    pool.check_integrity()
    # releases with no take between them keep their order across tiers: hit-once h (4)
    # was released before never-hit f (5), so it goes first (not a tie the never-hit
    # block wins)
    pool, _ = lru_order_scenario(10, [], [[(4, 1, NORMAL_VALUE)], [(5, 0, NORMAL_VALUE)]])
    assert take_ids(pool, 2) == [4, 5]
    pool.check_integrity()


def test_a_block_queued_anew_keeps_its_place_in_lru_order():
    # k (1) is kept for a running request, then never-hit a, b (2, 3) are released;
    # the take passes k over (parked) and takes a. k's rating changes while it is free
    # (its request ended): it goes back to the front of LRU's order, where its release
    # put it (not behind b, as a new release would be)
    pool, held = lru_order_scenario(10, [[(1, 0, PROTECTED)], [(2, 0, NORMAL_VALUE)],
                                        [(3, 0, NORMAL_VALUE)]])
    assert take_ids(pool, 1) == [2]
    k = held[1]
    k.value_hint = NORMAL_VALUE
    pool.free_blocks([], requeue=[k])
    assert take_ids(pool, 2) == [1, 3]
    pool.check_integrity()
    # a free block queued anew without being passed over stays where it was: c (4)
    # released before d (5), re-rated, still goes first
    pool, held = lru_order_scenario(10, [[(4, 0, NORMAL_VALUE)], [(5, 0, NORMAL_VALUE)]])
    c = held[4]
    c.value_hint = JUNCTION  # now a junction: hit once, but LRU's place is kept
    pool.free_blocks([], requeue=[c])
    assert take_ids(pool, 2) == [4, 5]
    pool.check_integrity()


class AlwaysLruOrder(hybrid_eviction.HybridTiers, EvictionPolicy):
    """The Python tiers in LRU order whatever the votes say."""

    uses_hints = True

    def __init__(self, blocks=()):
        super().__init__(blocks, hybrid_eviction.TIER_RULES)
        self._lru_share = 1.0

    def _vote(self, lru, count):
        pass


@pytest.mark.parametrize("seed", range(4))
def test_in_lru_order_the_tiers_take_what_lru_takes(monkeypatch, seed):
    # with every block never hit and rated plainly (one tier), LRU order must take
    # exactly the blocks the `lru` policy takes, through releases in any order, hits,
    # blocks queued anew and empty blocks
    monkeypatch.setitem(EVICTION_POLICIES, "always_lru_order", AlwaysLruOrder)
    rng = random.Random(seed)
    pools = [BlockPool(24, eviction_policy=name) for name in ("lru", "always_lru_order")]
    held: list[int] = []
    num_hashes = 0
    for _ in range(400):
        op = rng.random()
        free = pools[0].num_free_blocks
        if op < 0.35 and free:
            n = rng.randint(1, min(3, free))
            ids = [[b.block_id for b in pool.get_new_blocks(n)] for pool in pools]
            assert ids[0] == ids[1]
            for i in ids[0]:
                if rng.random() < 0.8:  # new data (else the block stays empty)
                    num_hashes += 1
                    data = num_hashes.to_bytes(32, "little")
                    for pool in pools:
                        assert pool.cache_block(pool.blocks[i], data, 0)
            held += ids[0]
        elif op < 0.7 and held:
            ids = rng.sample(held, rng.randint(1, min(5, len(held))))  # in any order
            for pool in pools:
                pool.free_blocks([pool.blocks[i] for i in ids])
            held = [i for i in held if i not in ids]
        else:
            cached = [b.block_id for b in pools[0].blocks[1:]
                      if b.ref_cnt == 0 and b.block_hash is not None]
            if not cached:
                continue
            i = rng.choice(cached)
            for pool in pools:
                block = pool.blocks[i]
                if op < 0.85:  # a hit (the count reset: one tier)
                    pool.touch([block])
                    block.num_hits = 0
                else:  # queued anew: LRU does not move it
                    pool.free_blocks([], requeue=[block])
            if op < 0.85:
                held.append(i)
    for pool in pools:
        pool.check_integrity()
