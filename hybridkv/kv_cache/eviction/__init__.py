"""Eviction policies: which free block is taken when new data needs one."""

from hybridkv.kv_cache.eviction.policy import (
    DEFAULT_EVICTION_POLICY,
    EVICTION_POLICIES,
    EvictionPolicy,
    LRUPolicy,
    make_eviction_policy,
    register_eviction_policy,
)

__all__ = [
    "DEFAULT_EVICTION_POLICY", "EVICTION_POLICIES", "EvictionPolicy", "LRUPolicy",
    "make_eviction_policy", "register_eviction_policy",
]
