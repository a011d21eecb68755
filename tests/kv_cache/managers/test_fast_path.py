"""The fast path's limits: each type's closed form equals the generic search."""

from hybridkv import KVCacheConfig, KVCacheGroupSpec, KVCacheManager, Request
from hybridkv.kv_cache.managers import SingleTypeManager
from hybridkv.tools.spec_mixes import CONFIGS


def test_closed_form_quiet_limits_equal_the_generic_search():
    """Each type's max_quiet_computed equals the base class's search over
    num_skipped_blocks, at every point of a chunked prefill."""
    for name, specs in CONFIGS.items():
        groups = [KVCacheGroupSpec([f"g{i}"], s) for i, s in enumerate(specs)]
        mgr = KVCacheManager(KVCacheConfig(400, groups))
        req = Request("r", list(range(150)))
        for computed in range(0, 150, 7):
            assert mgr.allocate_slots(req, min(7, 150 - computed)) is not None
            req.num_computed_tokens = min(computed + 7, 150)
            for m in mgr.coordinator.managers:
                assert m.max_quiet_computed(req) == SingleTypeManager.max_quiet_computed(m, req), \
                    (name, type(m).__name__, computed)
