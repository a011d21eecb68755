"""The KV cache layout an instance publishes (`GET /v1/kv_cache_layout`).

A router reads it to apply each group's reuse rule to the block events the
instance publishes: block hashes are computed with
`compute_block_hashes(token_ids, hash_block_size, hash_algo=hash_algo,
cache_salt=salt)` (the first block keyed by the request's `cache_salt`), and
group `g` with block size `B` covers `B // hash_block_size` hashes per block
(its hash is the chain hash at the block's last token). Example::

    {"instance_id": "127.0.0.1:8000", "model": "gemma3-tiny", "hash_algo": "sha256",
     "hash_block_size": 16, "enable_prefix_caching": true, "num_blocks": 1024,
     "max_model_len": 4096,
     "groups": [{"group_id": 0, "type": "sliding_window", "block_size": 16,
                 "num_layers": 3, "sliding_window": 32, "num_sink_tokens": 0},
                {"group_id": 1, "type": "full_attention", "block_size": 16,
                 "num_layers": 1}]}

With a shared Redis KV store (`--kv-store redis://...`) the layout also names
it, so a router can count what the store holds (`hybridkv route
--kv-store`): `"kv_store": {"url": "redis://host:port/db", "prefix": "hkv",
"fingerprint": "<32 hex digits>"}` (no credentials; the fingerprint is the
one in every store key of this model and layout).
"""

from __future__ import annotations

from typing import Any

from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

LAYOUT_VERSION = 1


def group_type(spec: KVCacheSpec) -> str:
    """The layout's name for a spec's attention type."""
    for cls, name in ((SinkFullAttentionSpec, "sink_full_attention"),
                      (SlidingWindowSpec, "sliding_window"),
                      (ChunkedLocalAttentionSpec, "chunked_local_attention"),
                      (FullAttentionSpec, "full_attention"),
                      (MambaSpec, "mamba")):
        if isinstance(spec, cls):
            return name
    return type(spec).__name__


def _group_fields(spec: KVCacheSpec) -> dict[str, Any]:
    if isinstance(spec, SlidingWindowSpec):
        return {"sliding_window": spec.sliding_window, "num_sink_tokens": spec.num_sink_tokens}
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return {"attention_chunk_size": spec.attention_chunk_size}
    if isinstance(spec, SinkFullAttentionSpec):
        return {"sink_len": spec.sink_len}
    if isinstance(spec, MambaSpec):
        return {"checkpoint_interval": spec.checkpoint_interval}
    return {}


def kv_cache_layout(llm: Any, model_name: str, instance_id: str) -> dict[str, Any]:
    """The layout of `llm`'s KV cache as a JSON-ready dict (see the module docstring)."""
    groups = []
    for gid, group in enumerate(llm.config.kv_cache_groups):
        spec = group.kv_cache_spec
        groups.append({"group_id": gid, "type": group_type(spec),
                       "block_size": spec.block_size, "num_layers": len(group.layer_names),
                       **_group_fields(spec)})
    out = {"version": LAYOUT_VERSION, "instance_id": instance_id, "model": model_name,
           "hash_algo": llm.kv.hash_algo, "hash_block_size": llm.kv.hash_block_size,
           "enable_prefix_caching": llm.kv.enable_caching,
           "num_blocks": llm.config.num_blocks, "max_model_len": llm.runner.max_model_len,
           "groups": groups}
    store = shared_store(llm)
    if store is not None:
        out["kv_store"] = store
    return out


def shared_store(llm: Any) -> dict[str, Any] | None:
    """The `kv_store` field: the engine's store when other instances can share
    it (redis://), else None."""
    tier = getattr(llm, "tier", None)
    if tier is None or getattr(tier.store, "scheme", None) != "redis":
        return None
    prefix = tier.store.prefix  # b"<prefix>:" in front of every key
    return {"url": tier.store.describe(), "prefix": prefix[:-1].decode(),
            "fingerprint": tier.keys.fingerprint.hex()}
