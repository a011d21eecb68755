"""The package's C extensions, all in one place.

- `_chainhash`: chained block hashing (`hybridkv.kv_cache.hashing`);
- `_fastpath`: the KV cache manager's hot paths (`hybridkv.kv_cache.fastpath`);
- `_codec`: the KV tier's batch encoding and eviction selection (`hybridkv.store.codec`);
- `_decode_attn`: decode attention read in place from the paged cache
  (`hybridkv.kernels.decode_native`);
- `_norm_rope`: RMSNorm, residual add and rotary embedding on float32 rows
  (`hybridkv.kernels.norm_rope`).

Each is optional: the Python module named beside it is the reference and runs
when the extension was not built.
"""
