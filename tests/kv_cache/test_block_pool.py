"""Exact block ids and free-queue order of the pool."""

import pytest

from hybridkv.kv_cache.block_pool import BlockPool
from hybridkv.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored


def ids(blocks):
    return [b.block_id for b in blocks]


def queue_ids(pool):
    return [b.block_id for b in pool.free_queue]


def test_fresh_pool_hands_out_blocks_in_order_and_never_the_null_block():
    pool = BlockPool(6)
    assert pool.num_free_blocks == 5
    assert ids(pool.get_new_blocks(3)) == [1, 2, 3]
    assert pool.null_block.block_id == 0
    assert queue_ids(pool) == [4, 5]
    pool.check_integrity()


def test_request_freed_tail_first_evicts_its_tail_before_its_head():
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)
    for i, b in enumerate(blocks):
        pool.cache_block(b, bytes([i]) * 32, 0)
    pool.free_blocks(reversed(blocks))  # a request returns its blocks tail first
    # uncached 4, 5 first, then the cached tail 3, 2, head 1
    assert queue_ids(pool) == [4, 5, 3, 2, 1]
    taken = pool.get_new_blocks(3)
    assert ids(taken) == [4, 5, 3]
    assert pool.get_cached_block(bytes([2]) * 32, 0) is None  # block 3 lost its data
    assert pool.get_cached_block(bytes([0]) * 32, 0).block_id == 1
    assert pool.num_evictions == 1
    pool.check_integrity()


def test_uncached_blocks_are_reused_before_any_cached_block():
    pool = BlockPool(5)
    a, b, c, d = pool.get_new_blocks(4)
    pool.cache_block(a, b"a" * 32, 0)
    pool.cache_block(c, b"c" * 32, 0)
    pool.free_blocks([a, b, c, d])
    assert queue_ids(pool)[:2] in ([2, 4], [4, 2])
    assert queue_ids(pool)[2:] == [1, 3]  # cached, least recently freed first


def test_touch_takes_free_cached_blocks_out_of_the_queue_and_refreshes_them():
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(4)
    for i, b in enumerate(blocks):
        pool.cache_block(b, bytes([i]) * 32, 0)
    pool.free_blocks(blocks)  # LRU order 1, 2, 3, 4
    pool.touch([blocks[0]])  # a hit on block 1
    assert queue_ids(pool) == [2, 3, 4]
    assert blocks[0].ref_cnt == 1
    pool.free_blocks([blocks[0]])  # released again: now most recently used
    assert queue_ids(pool) == [2, 3, 4, 1]
    pool.check_integrity()


def test_shared_block_is_freed_only_when_the_last_holder_lets_go():
    pool = BlockPool(3)
    (b,) = pool.get_new_blocks(1)
    pool.touch([b])
    pool.free_blocks([b])
    assert b.ref_cnt == 1 and 1 not in queue_ids(pool)
    pool.free_blocks([b])
    assert queue_ids(pool) == [1, 2]


def test_touch_and_free_skip_the_null_block():
    pool = BlockPool(3)
    pool.touch([pool.null_block])
    pool.free_blocks([pool.null_block])
    assert pool.null_block.ref_cnt == 0
    pool.check_integrity()


def test_duplicate_hash_is_not_cached_twice():
    pool = BlockPool(4, num_groups=2)
    a, b = pool.get_new_blocks(2)
    assert pool.cache_block(a, b"h" * 32, 0)
    assert not pool.cache_block(b, b"h" * 32, 0)
    assert b.block_hash is None
    assert pool.cache_block(b, b"h" * 32, 1)  # another group keys its own blocks
    pool.check_integrity()


def test_a_stored_block_counts_as_a_continuation_of_the_block_before_it():
    pool = BlockPool(12)
    h = [bytes([i]) * 32 for i in range(8)]
    first = pool.get_new_blocks(3)
    assert pool.cache_blocks(first, h[0:3], 0, 3, 0) == 3
    assert [b.num_children for b in first] == [1, 1, 0]
    # a second chain computed the first two blocks again into blocks of its own (not
    # stored: copies), then diverges: its third block is a second continuation of the
    # block caching h[1], found by its hash
    second = pool.get_new_blocks(3)
    assert pool.cache_blocks(second, [h[0], h[1], h[3]], 0, 3, 0) == 1
    assert [b.num_children for b in first] == [1, 2, 0]
    assert [b.num_children for b in second] == [0, 0, 0]
    # a group whose block before is null (left a window): found by its hash too
    (third,) = pool.get_new_blocks(1)
    assert pool.cache_blocks([pool.null_block, third], [h[0], h[4]], 1, 2, 0) == 1
    assert first[0].num_children == 2
    # cached in a later call: the block before it is the list's, cached earlier
    (tail,) = pool.get_new_blocks(1)
    assert pool.cache_blocks(first + [tail], h[0:3] + [h[5]], 3, 4, 0) == 1
    assert first[2].num_children == 1
    # data stored again in a block after an eviction counts its continuations anew
    pool.free_blocks(first + second + [third, tail])
    assert pool.evict_blocks([first[1].block_id]) == 1
    (again,) = pool.get_new_blocks(1)
    assert again is first[1]
    assert pool.cache_blocks([first[0], again], h[0:2], 1, 2, 0) == 1
    assert again.num_children == 0 and first[0].num_children == 3
    pool.check_integrity([again])


def test_evict_blocks_keeps_holders_and_moves_free_blocks_to_the_front():
    pool = BlockPool(5)
    a, b, c = pool.get_new_blocks(3)
    for blk, h in ((a, b"a"), (b, b"b"), (c, b"c")):
        pool.cache_block(blk, h * 32, 0)
    pool.free_blocks([a, b])
    assert queue_ids(pool) == [4, 1, 2]
    assert pool.evict_blocks([2, 3]) == 2
    assert queue_ids(pool)[0] == 2  # lost its data: reused first
    assert c.ref_cnt == 1 and c.block_hash is None  # still held
    assert pool.get_cached_block(b"a" * 32, 0) is a
    pool.check_integrity()


def test_evict_blocks_rejects_bad_ids_without_changing_anything():
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    pool.cache_block(a, b"a" * 32, 0)
    for bad in ([1, 9], [-1], ["1"], [True]):
        with pytest.raises(ValueError, match="block id"):
            pool.evict_blocks(bad)
        assert a.block_hash == b"a" * 32


def test_reset_prefix_cache_refuses_while_blocks_are_held():
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    pool.cache_block(a, b"a" * 32, 0)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(b"a" * 32, 0) is a
    pool.free_blocks([a])
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(b"a" * 32, 0) is None and a.block_hash is None
    pool.check_integrity()


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_blocks_emptied_by_reset_are_reused_before_later_cached_data(policy):
    pool = BlockPool(7, eviction_policy=policy)
    old = pool.get_new_blocks(4)
    pool.cache_blocks(old, [bytes([i]) * 32 for i in range(4)], 0, 4, 0)
    pool.free_blocks(old)
    pool.touch(old[:2])  # hit: the hybrid policy ranks them above never-hit data
    pool.free_blocks(old[:2])
    assert pool.reset_prefix_cache()
    assert all(b.num_hits == 0 and b.block_hash is None for b in old)
    new = pool.get_new_blocks(2)
    pool.cache_blocks(new, [b"n" * 32, b"m" * 32], 0, 2, 0)
    pool.free_blocks(new)
    taken = pool.get_new_blocks(4)  # the 4 free blocks holding nothing, not the new data
    assert pool.num_evictions == 0 and set(taken) == set(pool.blocks[1:]) - set(new)
    assert pool.get_cached_block(b"n" * 32, 0) is new[0]
    pool.check_integrity(taken)


def test_pinned_blocks_do_not_block_reset_and_are_never_free():
    pool = BlockPool(4)
    pinned = pool.pin_blocks(2)
    assert pool.reset_prefix_cache() is True
    assert pool.num_free_blocks == 1
    assert all(b not in pool.free_queue for b in pinned)


def test_events_report_stores_removals_and_clears():
    pool = BlockPool(3)
    events = []
    pool.subscribe(events.append)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, b"a" * 32, 0)
    pool.free_blocks([b, a])
    pool.get_new_blocks(2)  # takes uncached b, then evicts a
    pool.free_blocks([a, b])
    pool.reset_prefix_cache()
    assert events == [BlockStored(b"a" * 32, 0, 1), BlockRemoved(b"a" * 32, 0, 1),
                      AllBlocksCleared()]


def test_taking_more_blocks_than_free_raises_and_changes_nothing():
    pool = BlockPool(3)
    with pytest.raises(ValueError, match="only 2 are free"):
        pool.get_new_blocks(3)
    assert queue_ids(pool) == [1, 2]


@pytest.mark.parametrize("bad", [0, 1, -5, 2.0, "8", True])
def test_pool_size_is_validated(bad):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(bad)


def test_unknown_eviction_policy_is_rejected():
    with pytest.raises(ValueError, match="eviction_policy"):
        BlockPool(4, eviction_policy="random")


def test_check_integrity_catches_a_wrong_ref_count():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    with pytest.raises(AssertionError, match="holders"):
        pool.check_integrity([a])  # b is held but no holder was listed
