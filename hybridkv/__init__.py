"""hybridkv: automatic prefix caching for hybrid LLMs.

KV blocks that are hashed, shared across requests, reference counted and
evicted by a retention-aware policy, correct for full, sliding-window,
chunked-local, sink and Mamba layers at once, on one shared block pool.
"""

from hybridkv.kv_cache import (
    AllBlocksCleared,
    AttentionSpec,
    Block,
    BlockPool,
    BlockRemoved,
    BlockStored,
    ChunkedLocalAttentionSpec,
    EvictionPolicy,
    FullAttentionSpec,
    HybridCoordinator,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    KVCacheSpec,
    LRUPolicy,
    MambaSpec,
    PrefixCacheStats,
    Request,
    SingleTypeManager,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    compute_block_hashes,
    register_eviction_policy,
    register_manager,
)

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
