"""Exact block ids, worked out by hand from the reuse rules and the pool's order.

A fresh pool hands out blocks 1, 2, 3, ... in order; a request frees its
blocks tail first; a freed block holding no cached data goes to the front of
the free queue, a cached one to the back (LRU). Groups allocate in group
order. Every expectation below follows from those rules alone.
"""

import pytest

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from hybridkv.kv_cache.managers import MambaStatePlan, mamba_state_plan
from hybridkv.testing import snapshot_diff, state_snapshot

pytestmark = pytest.mark.both_backends  # each test runs on the C and the Python backend


def manager(specs, num_blocks):
    groups = [KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)]
    return KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy="lru")


def run(kv, req, expect_hit=0):
    """A new request: look up, adopt the hit, compute the rest of its tokens."""
    blocks, hit = kv.get_computed_blocks(req)
    assert hit == expect_hit
    assert kv.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
    req.num_computed_tokens = req.num_tokens
    kv.check_integrity()


def decode(kv, req, token):
    req.append_output_token_ids(token)
    assert kv.allocate_slots(req, 1) is not None
    req.num_computed_tokens += 1
    kv.check_integrity()


def free_queue(kv):
    return [b.block_id for b in kv.pool.free_queue]


def hit_ids(kv, tokens):
    blocks, length = kv.get_computed_blocks(Request("query", tokens))
    return blocks.get_block_ids(), length


PROMPT = list(range(100, 140))


def test_sliding_window_hit_reads_only_the_window():
    kv = manager([SlidingWindowSpec(4, sliding_window=8)], 16)  # window needs 2 blocks
    filler, a = Request("filler", PROMPT[:16]), Request("a", PROMPT[16:33])
    run(kv, filler)  # blocks 1-4
    run(kv, a)  # 17 tokens: blocks 5-9, the first four cached
    assert kv.get_block_ids("a") == ([5, 6, 7, 8, 9],)
    kv.free(a)  # 9 holds no cached data: front; then 8, 7, 6, 5 at the back
    assert free_queue(kv) == [9, 10, 11, 12, 13, 14, 15, 8, 7, 6, 5]
    b = Request("b", PROMPT[16:32] + [7])
    assert hit_ids(kv, b.all_token_ids) == (([0, 0, 7, 8],), 16)
    run(kv, b, expect_hit=16)
    assert kv.get_block_ids("b") == ([0, 0, 7, 8, 9],)
    # only the window was touched: 5 and 6 stay free and cached
    assert free_queue(kv) == [10, 11, 12, 13, 14, 15, 6, 5]
    assert [kv.pool.blocks[i].ref_cnt for i in (5, 6, 7, 8)] == [0, 0, 1, 1]


def test_refused_allocation_keeps_blocks_a_window_left_behind():
    kv = manager([SlidingWindowSpec(4, sliding_window=4)], 8)  # needs 1 block; 7 usable
    a = Request("a", PROMPT[:12])
    run(kv, a)  # blocks 1, 2, 3; free 4-7
    a.append_output_token_ids(PROMPT[12:40])  # 40 tokens: 10 blocks, 2 of 3 releasable
    before = state_snapshot(kv)
    # needs 7 new, 2 released + 4 free < 7, with no other request holding blocks: it
    # can never be served at this size (a smaller chunk fits, below)
    with pytest.raises(ValueError, match="'a' needs .* never be served"):
        kv.allocate_slots(a, 28)
    assert snapshot_diff(before, state_snapshot(kv)) == []
    assert kv.get_block_ids("a") == ([1, 2, 3],) and free_queue(kv) == [4, 5, 6, 7]
    assert kv.allocate_slots(a, 4) is not None  # 16 tokens: releases 1 and 2, takes 4
    assert kv.get_block_ids("a") == ([0, 0, 3, 4],)
    assert free_queue(kv) == [5, 6, 7, 2, 1]  # released tail first, still cached
    kv.check_integrity()


def test_chunked_hit_is_null_up_to_the_chunk_start():
    kv = manager([ChunkedLocalAttentionSpec(4, attention_chunk_size=8)], 16)
    a = Request("a", PROMPT[:20])
    assert hit_ids(kv, a.all_token_ids) == (([0, 0, 0, 0],), 16)  # nothing cached: a boundary
    assert kv.allocate_slots(a, 20) is not None  # computed from 0 anyway: blocks 1-5, cached
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5],)
    assert hit_ids(kv, PROMPT[:20] + [1]) == (([0, 0, 0, 0, 5],), 20)
    assert hit_ids(kv, PROMPT[:12] + [1]) == (([0, 0, 3],), 12)
    kv.free(a)
    kv.evict_blocks([1, 2, 3, 4, 5])
    # a chunk boundary is reusable with nothing cached
    assert hit_ids(kv, PROMPT[:17]) == (([0, 0, 0, 0],), 16)
    assert hit_ids(kv, PROMPT[:12] + [1]) == (([0, 0],), 8)


def test_mamba_hit_is_the_last_cached_state():
    kv = manager([MambaSpec(4)], 16)
    a = Request("a", PROMPT[:10])
    run(kv, a)  # checkpoints at 4 and 8 tokens (1, 2), live state 3
    assert kv.get_block_ids("a") == ([1, 2, 3],)
    assert mamba_state_plan([1, 2, 3], 0, 10, 4) == MambaStatePlan(3, None, [(4, 1), (8, 2)])
    decode(kv, a, 1)  # checkpoints written: off the list, the live block stays
    assert kv.get_block_ids("a") == ([0, 0, 3],)
    # 1 is released (cached); 2, the prompt end's state, stays held until a ends
    assert free_queue(kv) == list(range(4, 16)) + [1]
    assert kv.get_retained_block_ids("a") == ([2],)
    kv.free(a)  # the live state was never cached: front; 2 after it
    with pytest.raises(KeyError, match="'a' holds no blocks"):
        kv.get_retained_block_ids("a")
    b = Request("b", PROMPT[:10] + [5, 6])
    assert hit_ids(kv, b.all_token_ids) == (([0, 2],), 8)
    run(kv, b, expect_hit=8)  # touches 2; new checkpoint at 12 (3) and live state (4)
    assert kv.get_block_ids("b") == ([0, 2, 3, 4],)
    plan = mamba_state_plan(kv.get_block_ids("b")[0], 8, 4, 4)
    assert plan == MambaStatePlan(live_block_id=4, source_block_id=2, checkpoints=[(4, 3)])


def test_mamba_checkpoint_interval_keeps_every_third_boundary_and_the_prompt_end():
    kv = manager([MambaSpec(4, checkpoint_interval=3)], 16)
    a = Request("a", PROMPT[:22])
    run(kv, a)  # boundaries 3 (12 tokens) and 5 (prompt end, 20 tokens)
    assert kv.get_block_ids("a") == ([0, 0, 1, 0, 2, 3],)
    assert hit_ids(kv, PROMPT[:22] + [1]) == (([0, 0, 0, 0, 2],), 20)
    assert hit_ids(kv, PROMPT[:19] + [1, 2, 3]) == (([0, 0, 1],), 12)


def test_sink_blocks_are_pinned_and_never_listed():
    kv = manager([SinkFullAttentionSpec(4, sink_len=8)], 10)  # sinks take blocks 1, 2
    sinks = kv.coordinator.managers[0].sink_block_ids
    assert sinks == [1, 2] and kv.num_free_blocks == 7 and abs(kv.usage - 2 / 9) < 1e-12
    a = Request("a", PROMPT[:10])
    run(kv, a)
    assert kv.get_block_ids("a") == ([3, 4, 5],)
    assert hit_ids(kv, PROMPT[:8] + [1]) == (([3, 4],), 8)
    kv.free(a)
    kv.evict_blocks([1, 2])
    assert kv.reset_prefix_cache()
    assert [kv.pool.blocks[i].ref_cnt for i in sinks] == [1, 1]
    assert not set(sinks) & set(free_queue(kv)) and kv.num_free_blocks == 7
    big = Request("big", PROMPT[:29])  # 8 blocks: more than the 7 a request can have
    with pytest.raises(ValueError, match="'big' needs 8 more blocks"):  # never fits
        kv.allocate_slots(big, 29)
    fits = Request("fits", PROMPT[:28])
    run(kv, fits)  # the reset emptied 3 and 4, which are reused first, then 5-9
    assert kv.get_block_ids("fits") == ([4, 3, 5, 6, 7, 8, 9],) and kv.num_free_blocks == 0


def test_evicting_a_window_block_shrinks_the_hybrid_hit():
    kv = manager([FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=5)], 30)
    a = Request("a", PROMPT[:17])
    run(kv, a)  # full 1-5, window 6-10
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    kv.free(a)
    query = PROMPT[:16] + [1]
    assert hit_ids(kv, query) == (([1, 2, 3, 4], [0, 0, 0, 9]), 16)
    kv.evict_blocks([9])  # the window block before 16
    assert hit_ids(kv, query) == (([1, 2, 3], [0, 0, 8]), 12)
    kv.evict_blocks([8])
    assert hit_ids(kv, query) == (([1, 2], [0, 7]), 8)
    kv.evict_blocks([2])  # a full block: every longer prefix is lost
    assert hit_ids(kv, query) == (([1], [6]), 4)


def test_hybrid_hit_with_mixed_block_sizes_is_aligned():
    kv = manager([FullAttentionSpec(8), SlidingWindowSpec(4, sliding_window=5)], 30)
    a = Request("a", PROMPT[:17])
    run(kv, a)  # full 1-3 (8 tokens each), window 4-8
    assert kv.get_block_ids("a") == ([1, 2, 3], [4, 5, 6, 7, 8])
    query = PROMPT[:16] + [1]
    assert hit_ids(kv, query) == (([1, 2], [0, 0, 0, 7]), 16)
    kv.evict_blocks([7])  # the window alone would reuse 12; 8 is the aligned answer
    assert hit_ids(kv, query) == (([1], [0, 5]), 8)
    kv.evict_blocks([5])  # the window reaches 4 only: nothing aligned to 8
    assert hit_ids(kv, query) == (([], []), 0)


def test_mamba_state_shrinks_the_hybrid_hit():
    kv = manager([FullAttentionSpec(4), MambaSpec(8)], 30)
    a = Request("a", PROMPT[:17])
    run(kv, a)  # full 1-5; Mamba checkpoints 6 (8 tokens), 7 (16 tokens), live 8
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8])
    query = PROMPT[:16] + [1]
    assert hit_ids(kv, query) == (([1, 2, 3, 4], [0, 7]), 16)
    kv.evict_blocks([7])
    assert hit_ids(kv, query) == (([1, 2], [6]), 8)
    stats = kv.prefix_cache_stats
    assert (stats.queries, stats.hits) == (2 * 17 + 17, 16 + 8)


def test_a_hit_block_of_one_group_is_not_taken_by_another():
    kv = manager([FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=5)], 9)  # 8 usable
    a = Request("a", PROMPT[:16])
    run(kv, a)  # full 1-4, window 5-8, all cached
    kv.free(a)  # group by group, each tail first
    assert free_queue(kv) == [4, 3, 2, 1, 8, 7, 6, 5]
    b = Request("b", PROMPT[:16] + [1])
    # every group adopts its hit (1-4 and 8) before any group takes a new block
    run(kv, b, expect_hit=16)
    assert kv.get_block_ids("b") == ([1, 2, 3, 4, 7], [0, 0, 0, 8, 6])
    assert free_queue(kv) == [5]
