"""The KV cache: specs, hashing, the shared block pool, eviction, per-type managers,
the hybrid coordinator and the `KVCacheManager` facade a scheduler calls.

Imports point down: specs and hashing know no pool; the pool knows no attention
type; managers know one type each; the coordinator fans out over managers.
"""

from hybridkv.kv_cache.block_pool import Block, BlockPool
from hybridkv.kv_cache.coordinator import HybridCoordinator
from hybridkv.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored
from hybridkv.kv_cache.eviction import EvictionPolicy, LRUPolicy, register_eviction_policy
from hybridkv.kv_cache.hashing import compute_block_hashes
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from hybridkv.kv_cache.managers import SingleTypeManager, register_manager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

__all__ = [
    "AllBlocksCleared", "AttentionSpec", "Block", "BlockPool", "BlockRemoved", "BlockStored",
    "ChunkedLocalAttentionSpec", "EvictionPolicy", "FullAttentionSpec", "HybridCoordinator",
    "KVCacheBlocks", "KVCacheConfig", "KVCacheGroupSpec", "KVCacheManager", "KVCacheSpec",
    "LRUPolicy", "MambaSpec", "PrefixCacheStats", "Request", "SingleTypeManager",
    "SinkFullAttentionSpec", "SlidingWindowSpec", "compute_block_hashes",
    "register_eviction_policy", "register_manager",
]
