"""KVCacheManager's contract beyond bad inputs (those are in
tests/reliability/test_bad_inputs.py): never vs wait, resets, stats, warnings."""

import warnings

import pytest

from hybridkv import (
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from hybridkv.testing import state_snapshot

pytestmark = pytest.mark.both_backends  # each test runs on the C and the Python backend


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


def test_an_allocation_that_could_never_be_served_raises_and_changes_nothing():
    mgr = make_manager(num_blocks=9)
    req = Request("a", list(range(40)))
    assert mgr.allocate_slots(req, 16) is not None  # 4 full + 4 window blocks
    req.num_computed_tokens = 16
    before = state_snapshot(mgr)
    # the window would release blocks, but 16 more tokens need more than the pool has
    with pytest.raises(ValueError, match="never be served"):
        mgr.allocate_slots(req, 16)
    assert state_snapshot(mgr) == before
    mgr.check_integrity()


def test_can_fit_tells_never_from_wait():
    mgr = make_manager(num_blocks=9)  # 8 usable blocks
    assert mgr.can_fit(12)  # 3 full + 3 window blocks
    assert not mgr.can_fit(40)  # 10 full blocks alone exceed the pool
    other = Request("o", list(range(16)))
    assert mgr.allocate_slots(other, 16) is not None  # the pool is full: 12 fits later
    # (other tokens than `other`'s: a prompt of the same data would share its blocks)
    assert mgr.allocate_slots(Request("b", list(range(100, 112))), 12) is None
    assert mgr.can_fit(12)


def test_reset_prefix_cache_refuses_while_a_request_holds_blocks(busy):
    mgr, req = busy
    before = state_snapshot(mgr)
    assert mgr.reset_prefix_cache() is False
    assert state_snapshot(mgr) == before
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


def test_the_manager_holds_the_backend_under_test(backend):
    """The backend is an object the manager holds, and allocate_slots is its method."""
    mgr = make_manager()
    assert mgr.backend == backend and mgr._core.owner is mgr
    assert mgr._core.native == (backend == "c")  # every group a type the C paths know
    assert mgr.allocate_slots.__self__ is mgr._core
    req = Request("r", list(range(9)))
    assert mgr.allocate_slots(req, 8).get_block_ids() == ([1, 2], [3, 4])
    req.num_computed_tokens = 8
    assert mgr.allocate_slots(req, 1).get_block_ids() == ([5], [6])
    # the method the class defines does what the bound one does: here, nothing
    assert KVCacheManager.allocate_slots(mgr, req, 1) is mgr.allocate_slots(req, 1)


def test_a_backend_name_is_checked():
    with pytest.raises(ValueError, match="backend must be one of 'c', 'python' or None, "
                                         "got 'rust'"):
        make_manager(backend="rust")


def test_a_subclass_overriding_allocate_slots_keeps_its_override():
    calls = []

    class Counting(KVCacheManager):
        def allocate_slots(self, request, num_new_tokens, *args):
            calls.append(num_new_tokens)
            return super().allocate_slots(request, num_new_tokens, *args)

    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(4))]
    mgr = Counting(KVCacheConfig(8, groups))
    assert mgr.allocate_slots(Request("r", list(range(5))), 4).get_block_ids() == ([1],)
    assert calls == [4]
