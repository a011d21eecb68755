"""hybridkv: automatic prefix caching for hybrid LLMs.

KV blocks that are hashed, shared across requests, reference counted and
evicted LRU, correct for full, sliding-window, chunked-local, sink and Mamba
layers at once, on one shared block pool.
"""

from hybridkv.coordinator import HybridCoordinator
from hybridkv.core.block_pool import Block, BlockPool
from hybridkv.core.events import AllBlocksCleared, BlockRemoved, BlockStored
from hybridkv.core.eviction import EvictionPolicy, LRUPolicy, register_eviction_policy
from hybridkv.core.hashing import compute_block_hashes
from hybridkv.core.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.core.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from hybridkv.kv_cache_manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from hybridkv.managers import SingleTypeManager, register_manager
from hybridkv.request import Request

__version__ = "0.1.0"

_ENGINE_NAMES = ("LLM", "SamplingParams", "RequestOutput", "RequestMetrics", "EngineStats")


def __getattr__(name: str):
    """The engine (torch, transformers) is imported only when first used."""
    if name in _ENGINE_NAMES:
        from hybridkv import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'hybridkv' has no attribute {name!r}")


__all__ = [
    "LLM", "SamplingParams", "RequestOutput", "RequestMetrics", "EngineStats",
    "AllBlocksCleared", "AttentionSpec", "Block", "BlockPool", "BlockRemoved", "BlockStored",
    "ChunkedLocalAttentionSpec", "EvictionPolicy", "FullAttentionSpec", "HybridCoordinator",
    "KVCacheBlocks", "KVCacheConfig", "KVCacheGroupSpec", "KVCacheManager", "KVCacheSpec",
    "LRUPolicy", "MambaSpec", "PrefixCacheStats", "Request", "SingleTypeManager",
    "SinkFullAttentionSpec", "SlidingWindowSpec", "compute_block_hashes",
    "register_eviction_policy", "register_manager",
]
