"""A complete, comparable picture of a KVCacheManager's state."""


def snapshot(mgr):
    pool = mgr.pool
    return {
        "free_queue": [b.block_id for b in pool.free_queue],
        "refs": [b.ref_cnt for b in pool.blocks],
        "hashes": [(b.block_hash, b.group_id) for b in pool.blocks],
        "maps": [sorted((h, b.block_id) for h, b in t.items()) for t in pool.cached],
        "requests": {rid: [[b.block_id for b in m.req_to_blocks.get(rid, [])]
                           for m in mgr.coordinator.managers]
                     for m in mgr.coordinator.managers for rid in m.req_to_blocks},
        "skipped": [dict(m.num_skipped) for m in mgr.coordinator.managers],
        "cached_counts": [dict(m.num_cached_blocks) for m in mgr.coordinator.managers],
        "stats": vars(mgr.prefix_cache_stats).copy(),
        "evictions": pool.num_evictions,
    }
