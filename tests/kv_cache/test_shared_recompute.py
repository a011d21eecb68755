"""A request that recomputes data a full-attention block caches takes that block
instead of a new one (`SingleTypeManager.shared_run`): one copy of the data.

Small exact scenarios; they hold on the C fast path and, with
HYBRIDKV_DISABLE_FASTPATH=1, on the Python reference.
"""

import pytest

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
)
from hybridkv.testing.oracles import snapshot_diff, state_snapshot

pytestmark = pytest.mark.both_backends  # each test runs on the C and the Python backend

B = 4


def full_only(num_blocks):
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(B))]
    return KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy="lru",
                          warn_repeated_misses=False)


def full_and_window(num_blocks=40):
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(B)),
              KVCacheGroupSpec(["s"], SlidingWindowSpec(B, sliding_window=6))]
    return KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy="lru",
                          warn_repeated_misses=False)


def admit(mgr, req):
    """Look up, allocate the rest of the prompt; the hit in tokens."""
    blocks, hit = mgr.get_computed_blocks(req)
    assert mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks if hit else None) \
        is not None
    req.num_computed_tokens = req.num_tokens
    return hit


def test_the_last_block_of_a_whole_prompt_is_taken_not_copied():
    """A prompt of whole blocks hits all but its last block (the last token is
    computed for its logits); that block is taken from the cache."""
    mgr = full_only(num_blocks=10)
    a = Request("a", list(range(8)))
    admit(mgr, a)
    ids_a = mgr.get_block_ids("a")[0]
    mgr.free(a)
    b = Request("b", list(range(8)))
    assert admit(mgr, b) == 4
    assert mgr.get_block_ids("b")[0] == ids_a
    assert mgr.num_free_blocks == 9 - 2  # the two cached blocks, held again
    mgr.free(b)
    mgr.check_integrity()


def test_a_held_block_costs_no_free_block():
    """With no free block left, a request whose only new data another running
    request holds is served; one that needs one more block is refused and
    changes nothing."""
    mgr = full_only(num_blocks=4)  # 3 usable blocks
    a = Request("a", list(range(9)))
    admit(mgr, a)  # 2 full blocks + 1 partial: the pool is empty
    assert mgr.num_free_blocks == 0
    b = Request("b", list(range(8)))
    assert admit(mgr, b) == 4  # block 1 is a's, held: nothing to take
    assert mgr.get_block_ids("b")[0] == mgr.get_block_ids("a")[0][:2]
    c = Request("c", list(range(8)) + [50, 51, 52, 53])
    before = state_snapshot(mgr)
    assert mgr.allocate_slots(c, 12) is None  # blocks 0-1 shared, block 2 new: no room
    assert snapshot_diff(before, state_snapshot(mgr)) == []
    for r in (a, b):
        mgr.free(r)
    mgr.check_integrity()
    assert mgr.num_free_blocks == 3


def test_full_blocks_past_a_lost_window_are_taken_window_blocks_are_not():
    """The document's window blocks at positions 3 and 4 are gone, so the hit
    stops at 12 tokens; the full-attention blocks after it are the cached ones,
    the window's are new even where a cached one exists (position 5)."""
    mgr = full_and_window()
    doc = list(range(100, 124))  # 6 blocks
    a = Request("a", doc)
    admit(mgr, a)
    full_a, window_a = mgr.get_block_ids("a")
    mgr.free(a)
    mgr.evict_blocks([window_a[3], window_a[4]])
    b = Request("b", doc + [7])
    assert admit(mgr, b) == 12
    full_b, window_b = mgr.get_block_ids("b")
    assert full_b[:6] == full_a[:6]  # 3 hit + 3 taken instead of recomputed copies
    assert full_b[6] not in full_a
    assert window_b[5] != window_a[5] and mgr.coordinator.managers[1].shares is False
    mgr.free(b)
    mgr.check_integrity()
    assert mgr.num_free_blocks == 39


def test_a_chunk_takes_the_cached_blocks_it_will_compute():
    """A later prefill chunk (no hit of its own) takes the cached blocks of its
    positions, up to the first one not cached."""
    mgr = full_only(num_blocks=20)
    a = Request("a", list(range(16)))
    admit(mgr, a)
    ids_a = mgr.get_block_ids("a")[0]
    b = Request("b", list(range(8)) + [90] * 4 + list(range(12, 16)))
    assert mgr.allocate_slots(b, 4) is not None  # chunk 1: block 0, taken
    b.num_computed_tokens = 4
    assert mgr.get_block_ids("b")[0] == ids_a[:1]
    assert mgr.allocate_slots(b, 12) is not None  # block 1 taken; block 2 differs: new
    ids_b = mgr.get_block_ids("b")[0]
    assert ids_b[:2] == ids_a[:2] and not set(ids_b[2:]) & set(ids_a)
    for r in (a, b):
        mgr.free(r)
    mgr.check_integrity()
