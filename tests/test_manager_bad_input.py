"""Every invalid call raises the documented error and changes nothing."""

import warnings

import pytest
from snapshot import snapshot

from hybridkv import (
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
    compute_block_hashes,
)


def make_manager(num_blocks=16, **kw):
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(4)),
              KVCacheGroupSpec(["s"], SlidingWindowSpec(4, sliding_window=6))]
    return KVCacheManager(KVCacheConfig(num_blocks, groups), **kw)


@pytest.fixture
def busy():
    """A manager with one running request and some cached blocks."""
    mgr = make_manager()
    req = Request("a", list(range(14)))
    mgr.allocate_slots(req, 10)
    req.num_computed_tokens = 10
    return mgr, req


@pytest.mark.parametrize("call, match", [
    (lambda m, r: m.allocate_slots(r, -1), "num_new_tokens"),
    (lambda m, r: m.allocate_slots(r, 1.0), "num_new_tokens"),
    (lambda m, r: m.allocate_slots(r, True), "num_new_tokens"),
    (lambda m, r: m.allocate_slots(r, 5), "exceed"),
    (lambda m, r: m.allocate_slots(r, 0, -4), "num_new_computed_tokens"),
    (lambda m, r: m.allocate_slots(r, 0, 4, None), "new_computed_blocks"),
    (lambda m, r: m.allocate_slots(r, 0, 4, KVCacheBlocks(([], []))), "already holds"),
    (lambda m, r: m.allocate_slots("a", 1), "Request"),
    (lambda m, r: m.allocate_slots(Request("a", [1, 2]), 1), "already in use"),
    (lambda m, r: m.evict_blocks([99]), "block id"),
    (lambda m, r: m.evict_blocks([1, -1]), "block id"),
])
def test_bad_calls_raise_and_leave_state_unchanged(busy, call, match):
    mgr, req = busy
    before = snapshot(mgr)
    with pytest.raises(ValueError, match=match):
        call(mgr, req)
    assert snapshot(mgr) == before
    mgr.check_integrity()


def test_hit_blocks_that_do_not_match_the_token_count_are_rejected():
    mgr = make_manager()
    a = Request("a", list(range(12)))
    mgr.allocate_slots(a, 12)
    a.num_computed_tokens = 12
    mgr.free(a)
    b = Request("b", list(range(12)) + [99])
    blocks, n = mgr.get_computed_blocks(b)
    assert n == 12
    before = snapshot(mgr)
    with pytest.raises(ValueError, match="cover"):
        mgr.allocate_slots(b, 1, 8, blocks)
    with pytest.raises(ValueError, match="new_computed_blocks"):
        mgr.allocate_slots(b, 1, 12, blocks.get_block_ids())
    assert snapshot(mgr) == before


@pytest.mark.parametrize("make, match", [
    (lambda: Request("", [1]), "request_id"),
    (lambda: Request(7, [1]), "request_id"),
    (lambda: Request("a", []), "empty"),
    (lambda: Request("a", "hello"), "prompt_token_ids"),
    (lambda: Request("a", 5), "prompt_token_ids"),
    (lambda: Request("a", [1], cache_salt=3), "cache_salt"),
    (lambda: Request("a", [1], lora_name=b"x"), "lora_name"),
    (lambda: Request("a", [1], max_tokens=0), "max_tokens"),
    (lambda: Request("a", [1], mm_hashes=[("h", 0)]), "mm_hashes"),
    (lambda: Request("a", [1], mm_hashes=[("h", -1, 2)]), "offset"),
    (lambda: KVCacheManager("config"), "kv_cache_config"),
    (lambda: make_manager(hash_algo="md5"), "hash_algo"),
    (lambda: make_manager(eviction_policy="fifo"), "eviction_policy"),
    (lambda: compute_block_hashes([1, 2], 0), "block_size"),
    (lambda: compute_block_hashes([1, -2], 1), "token id"),
    (lambda: compute_block_hashes([1, 2**32], 1), "token id"),
    (lambda: compute_block_hashes([1, 2.0], 1), "token id"),
    (lambda: compute_block_hashes([1, 2], 1, hash_algo="sha1"), "hash_algo"),
])
def test_bad_construction_raises_value_error_naming_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("bad", [-5, 2**32, 1.5, None, "7", True])
def test_bad_token_ids_are_rejected_in_prompts_and_appends(bad):
    with pytest.raises(ValueError, match="token id"):
        Request("x", [1, 2, 3, 4, bad, 6])
    req = Request("x", [1, 2])
    with pytest.raises(ValueError, match="token"):
        req.append_output_token_ids([3, bad])
    with pytest.raises(ValueError, match="token"):
        req.append_output_token_ids(bad)
    assert req.all_token_ids == [1, 2]


def test_refused_allocation_changes_nothing_not_even_window_releases():
    mgr = make_manager(num_blocks=9)
    req = Request("a", list(range(40)))
    assert mgr.allocate_slots(req, 16) is not None  # 4 full + 4 window blocks
    req.num_computed_tokens = 16
    before = snapshot(mgr)
    # the window would release blocks, but 16 more tokens need more than the pool has
    with pytest.raises(ValueError, match="never be served"):
        mgr.allocate_slots(req, 16)
    assert snapshot(mgr) == before
    mgr.check_integrity()


def test_free_twice_or_of_an_unknown_request_raises_and_changes_nothing():
    mgr = make_manager()
    req = Request("a", list(range(9)))
    mgr.allocate_slots(req, 9)
    mgr.free(req)
    after = snapshot(mgr)
    with pytest.raises(KeyError, match="'a' holds no blocks"):
        mgr.free(req)
    with pytest.raises(KeyError, match="'never' holds no blocks"):
        mgr.free(Request("never", [1]))
    with pytest.raises(KeyError, match="'a' holds no blocks"):
        mgr.get_block_ids("a")
    assert snapshot(mgr) == after
    assert mgr.num_free_blocks == 15


def test_can_fit_tells_never_from_wait():
    mgr = make_manager(num_blocks=9)  # 8 usable blocks
    assert mgr.can_fit(12)  # 3 full + 3 window blocks
    assert not mgr.can_fit(40)  # 10 full blocks alone exceed the pool
    other = Request("o", list(range(16)))
    assert mgr.allocate_slots(other, 16) is not None  # the pool is full: 12 fits later
    assert mgr.allocate_slots(Request("b", list(range(12))), 12) is None
    assert mgr.can_fit(12)


def test_reset_prefix_cache_refuses_while_a_request_holds_blocks(busy):
    mgr, req = busy
    before = snapshot(mgr)
    assert mgr.reset_prefix_cache() is False
    assert snapshot(mgr) == before
    mgr.free(req)
    assert mgr.reset_prefix_cache() is True
    assert mgr.get_computed_blocks(Request("c", list(range(14))))[1] == 0


def test_stats_are_cumulative_and_not_reset_by_reading():
    mgr = make_manager()
    a = Request("a", list(range(9)))
    mgr.get_computed_blocks(a)
    mgr.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    mgr.free(a)
    b = Request("b", list(range(9)))
    assert mgr.get_computed_blocks(b)[1] == 8
    stats = mgr.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 18, 8)
    assert mgr.prefix_cache_stats.hits == 8


def test_caching_off_never_hits():
    mgr = make_manager(enable_caching=False)
    a = Request("a", list(range(9)))
    mgr.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    mgr.free(a)
    blocks, n = mgr.get_computed_blocks(Request("b", list(range(9))))
    assert n == 0 and blocks.get_block_ids() == ([], [])


def test_mamba_hit_is_a_block_boundary_state():
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(4)),
              KVCacheGroupSpec(["m"], MambaSpec(4))]
    mgr = KVCacheManager(KVCacheConfig(32, groups))
    a = Request("a", list(range(10)))
    mgr.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    mgr.free(a)
    b = Request("b", list(range(10)) + [77])
    blocks, n = mgr.get_computed_blocks(b)
    assert n == 8
    full_ids, mamba_ids = blocks.get_block_ids()
    assert len(full_ids) == 2 and mamba_ids[0] == 0 and mamba_ids[1] != 0
    assert isinstance(blocks, KVCacheBlocks)


def test_per_group_stats_and_stranded_tokens():
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(4)),
              KVCacheGroupSpec(["s"], SlidingWindowSpec(4, sliding_window=5))]
    mgr = KVCacheManager(KVCacheConfig(32, groups))
    a = Request("a", list(range(17)))
    mgr.allocate_slots(a, 17)
    a.num_computed_tokens = 17
    mgr.free(a)
    # evict the window block before 16 (block 3 of the sliding group): the hit falls back to 12
    window_block = mgr.pool.get_cached_block(a.block_hashes("sha256", 4)[3], 1)
    mgr.evict_blocks([window_block.block_id])
    b = Request("b", list(range(17)) + [50])
    _, n = mgr.get_computed_blocks(b)
    stats = mgr.prefix_cache_stats
    assert n == 12
    assert stats.group_hits == [16, 12] and stats.stranded_tokens == 4
    assert stats.evictions == 0 and stats.group_evictions == [0, 0]


def test_warns_once_per_manager_when_repeated_prefixes_never_hit():
    mgr = make_manager(num_blocks=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for start in (0, 100):  # two prompt starts, each looked up 5 times in vain
            for i in range(5):
                mgr.get_computed_blocks(Request(f"r{i}", list(range(start, start + 8))))
    assert len(caught) == 1 and "looked up 3 times" in str(caught[0].message)
    assert mgr.prefix_cache_stats.repeated_miss_prefixes == 2


def test_repeated_miss_warning_can_be_turned_off():
    mgr = make_manager(num_blocks=8, warn_repeated_misses=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(5):
            mgr.get_computed_blocks(Request(f"r{i}", list(range(8))))
    assert mgr.prefix_cache_stats.repeated_miss_prefixes == 1
