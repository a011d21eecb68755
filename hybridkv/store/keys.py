"""Store keys of KV blocks and the fingerprint of a model's cache layout.

A block's key is

    b"hkv1" | layout fingerprint (16 B) | group id (u16, big-endian) | block hash

The block hash is the process-independent chained hash of the block's
tokens (hybridkv.kv_cache.hashing): it already covers every earlier block,
the cache salt (first block) and the LoRA name. The fingerprint covers the
model (its config and every weight) and the cache layout (groups, specs,
layer names, page size, hash algorithm), so two models, or one model under
two layouts, never read each other's blocks.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig

KEY_PREFIX = b"hkv1"
FINGERPRINT_BYTES = 16


def layout_fingerprint(model_digest: bytes, config: KVCacheConfig, hash_algo: str) -> bytes:
    """16 bytes naming a model (by `model_digest`) under one cache layout.

    The pool size (`num_blocks`) is left out: engines with different pool
    sizes share blocks.
    """
    h = hashlib.sha256(b"hybridkv/layout/v1\0")
    h.update(len(model_digest).to_bytes(4, "little") + model_digest)
    parts = [f"hash_algo={hash_algo}", f"page={config.page_size_bytes}",
             f"tensors={config.num_tensors}"]
    for i, group in enumerate(config.kv_cache_groups):
        parts.append(f"group {i}: {group.kv_cache_spec!r} layers={list(group.layer_names)!r}")
    h.update("\n".join(parts).encode())
    return h.digest()[:FINGERPRINT_BYTES]


class KeySpace:
    """Builds store keys for one fingerprint: `keys(group_id, hashes)`."""

    def __init__(self, fingerprint: bytes, num_groups: int) -> None:
        if len(fingerprint) != FINGERPRINT_BYTES:
            raise ValueError(f"fingerprint must be {FINGERPRINT_BYTES} bytes, "
                             f"got {len(fingerprint)}")
        self.fingerprint = fingerprint
        # per group: what every key starts with
        self.prefixes = [KEY_PREFIX + fingerprint + struct.pack(">H", g)
                          for g in range(num_groups)]

    def key(self, group_id: int, block_hash: bytes) -> bytes:
        return self.prefixes[group_id] + block_hash

    def keys(self, group_id: int, block_hashes: Sequence[bytes]) -> list[bytes]:
        prefix = self.prefixes[group_id]
        return [prefix + h for h in block_hashes]
