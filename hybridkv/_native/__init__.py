"""The package's C extensions, all in one place.

- `_chainhash`: chained block hashing (`hybridkv.kv_cache.hashing`);
- `_fastpath`: the KV cache manager's hot paths (`hybridkv.kv_cache.fastpath`);
- `_codec`: the KV tier's batch encoding and eviction selection (`hybridkv.store.codec`).

Each is optional: the Python module named beside it is the reference and runs
when the extension was not built.
"""
