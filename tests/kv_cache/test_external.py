"""Second-tier hooks of the KV cache: lookups in the hit search, imports, the eviction hook."""

import pytest

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from hybridkv.kv_cache.external import EXTERNAL
from hybridkv.testing.oracles import snapshot_diff, state_snapshot

pytestmark = pytest.mark.both_backends  # each test runs on the C and the Python backend


def manager(num_blocks=40, policy="lru"):
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(4)),
              KVCacheGroupSpec(["w"], SlidingWindowSpec(4, sliding_window=5)),
              KVCacheGroupSpec(["m"], MambaSpec(4))]
    return KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy=policy)


def cache(kv, rid, tokens):
    req = Request(rid, tokens)
    assert kv.allocate_slots(req, len(tokens)) is not None
    req.num_computed_tokens = len(tokens)
    kv.free(req)
    return req


def test_lookups_find_placeholders_and_the_pool_search_is_unchanged():
    kv = manager()
    cache(kv, "a", list(range(16)))
    req = Request("b", list(range(24)) + [99])
    blocks, n = kv.get_computed_blocks(req)
    assert n == 16
    hashes = req.block_hashes(kv.hash_algo, kv.hash_block_size)
    store = {h for h in hashes[4:6]}  # blocks 4 and 5 of every group

    def lookup(g):
        get = kv.pool.cached[g].get
        return lambda h: get(h) or (EXTERNAL if h in store else None)

    hit, reach, matched = kv.find_cache_hit(req, [lookup(g) for g in range(3)])
    assert (reach, matched) == (24, 24)
    assert hit.blocks[0][:4] == blocks.blocks[0] and hit.blocks[0][4:] == [EXTERNAL] * 2
    assert hit.blocks[1][-1] is EXTERNAL and hit.blocks[2][-1] is EXTERNAL
    # a placeholder costs one free block each
    need_plain = kv.num_blocks_to_admit(req, blocks, 16, 9)
    need_ext = kv.num_blocks_to_admit(req, hit, 24, 1)
    assert need_ext >= 4
    assert kv.find_cache_hit(req)[1] == 16 and need_plain > 0


def test_import_holds_the_hit_caches_what_arrived_and_frees_the_rest():
    kv = manager(num_blocks=12)
    cache(kv, "a", list(range(8)))
    req = Request("b", list(range(16)) + [1])
    hashes = req.block_hashes(kv.hash_algo, kv.hash_block_size)
    hit, _, _ = kv.find_cache_hit(req, [
        lambda h, g=g: kv.pool.cached[g].get(h) or (EXTERNAL if h in hashes[2:4] else None)
        for g in range(3)])
    wanted = [(g, h) for g in range(3) for i, h in enumerate(hashes[:4])
              if hit.blocks[g][i] is EXTERNAL]
    evicted = []
    kv.on_evict(lambda blocks: evicted.extend((b.block_id, b.block_hash) for b in blocks))
    imp = kv.begin_import(hit, wanted)
    assert imp is not None and len(imp.block_ids) == len(wanted)
    held = [b for g in hit.blocks for b in g if b is not kv.pool.null_block and b is not EXTERNAL]
    assert all(b.ref_cnt == 1 and b.num_hits == 0 for b in held)  # held, not counted as hits
    assert not {b.block_id for b in held} & {i for i, _ in evicted}
    loaded = [i % 2 == 0 for i in range(len(wanted))]
    assert kv.end_import(imp, loaded) == sum(loaded)
    for slot, ok in zip(imp.slots, loaded):
        assert (kv.pool.get_cached_block(slot.block_hash, slot.group_id) is slot.block) == ok
    assert kv.num_free_blocks == 11
    kv.check_integrity()


def test_a_refused_import_changes_nothing():
    kv = manager(num_blocks=8)
    cache(kv, "a", list(range(8)))
    req = Request("b", list(range(40)))
    hashes = req.block_hashes(kv.hash_algo, kv.hash_block_size)
    blocks, _, _ = kv.find_cache_hit(req)
    before = state_snapshot(kv)
    assert kv.begin_import(blocks, [(0, h) for h in hashes[2:10]]) is None
    assert snapshot_diff(before, state_snapshot(kv)) == []


def test_evict_listeners_that_skip_empty_blocks_get_every_taken_block():
    """`skips_empty`: the listener gets the blocks taken unfiltered (it passes over those
    without a hash itself) while no other kind listens; the cached ones are the same."""
    for kinds in ([True], [True, False]):
        kv = KVCacheManager(KVCacheConfig(6, [KVCacheGroupSpec(["a"], FullAttentionSpec(4))]))
        seen: list[list[tuple[int, bytes | None]]] = [[] for _ in kinds]
        for i, skips in enumerate(kinds):
            kv.on_evict(lambda blocks, out=seen[i]: out.extend(
                (b.block_id, b.block_hash) for b in blocks), skips_empty=skips)
        for n in range(4):  # requests of 8 tokens: the pool of 5 blocks recycles them
            req = Request(f"r{n}", [10 * n + t for t in range(8)])
            kv.allocate_slots(req, 8)
            kv.free(req)
        cached = [[b for b in s if b[1] is not None] for s in seen]
        assert all(c == cached[0] for c in cached) and cached[0]
        assert any(h is None for _, h in seen[0]) == (kinds == [True])
