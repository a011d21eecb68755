"""KV tiers: stores behind the device pool for blocks it evicts.

`open_store(url)` opens `cpu://?size=4GiB`, `file:///dir?size=20GiB` or
`redis://host:port/db`; `KVTier` connects a store to a KVCacheManager
(blocks the pool evicts are written to the store, prefixes the pool lacks
are read back instead of recomputed).
"""

from hybridkv.store.base import KVStore, StoreError, StoreFull, StoreStats
from hybridkv.store.cpu import CpuStore
from hybridkv.store.file import FileStore
from hybridkv.store.keys import KeySpace, layout_fingerprint
from hybridkv.store.payload import BlockLayout, PayloadError, decode_block, encode_block
from hybridkv.store.redis_store import RedisStore
from hybridkv.store.stats import GroupTierStats, KVStoreStats
from hybridkv.store.tier import KVTier, TierHit
from hybridkv.store.url import open_store, parse_size, parse_store_url

__all__ = [
    "BlockLayout", "CpuStore", "FileStore", "GroupTierStats", "KVStore", "KVStoreStats",
    "KVTier", "KeySpace", "PayloadError", "RedisStore", "StoreError", "StoreFull",
    "StoreStats", "TierHit", "decode_block", "encode_block", "layout_fingerprint",
    "open_store", "parse_size", "parse_store_url",
]
