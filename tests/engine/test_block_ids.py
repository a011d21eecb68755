"""BlockIdCache against the manager's own get_block_ids, step by step."""

import numpy as np

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from hybridkv.engine.block_ids import BlockIdCache


def test_cached_ids_follow_new_released_and_readmitted_blocks():
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(block_size=4)),
              KVCacheGroupSpec(["s"], SlidingWindowSpec(block_size=4, sliding_window=8)),
              KVCacheGroupSpec(["m"], MambaSpec(block_size=4))]
    kv = KVCacheManager(KVCacheConfig(200, groups))
    cache = BlockIdCache()
    reqs = {f"r{i}": Request(f"r{i}", list(range(10 * i, 10 * i + 6))) for i in range(3)}
    for req in reqs.values():
        assert kv.allocate_slots(req, req.num_tokens) is not None
        req.num_computed_tokens = req.num_tokens
    for step in range(40):
        if step == 17:  # preempted, then admitted again under the same id
            req = reqs["r1"]
            kv.free(req)
            req.num_computed_tokens = 0
            assert kv.allocate_slots(req, req.num_tokens) is not None
            req.num_computed_tokens = req.num_tokens
        rids = list(reqs) if step % 5 else ["r2", "r0"]  # some steps leave r1 out
        got = cache.block_ids(kv, rids)
        for rid, per_group in zip(rids, got):
            want = kv.get_block_ids(rid)
            assert [g.ids for g in per_group] == [list(w) for w in want]
            for g, w in zip(per_group, want):
                assert g.array.dtype == np.int32 and g.array.tolist() == list(w)
        for req in reqs.values():  # one decode step each: new blocks, released windows
            req.append_output_token_ids([step % 7])
            assert kv.allocate_slots(req, 1) is not None
            req.num_computed_tokens += 1
    kv.check_integrity()
