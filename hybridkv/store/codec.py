"""Per-batch work of the KV tier: encoding stored values, selecting evicted blocks.

Both run once per batch rather than once per block: a tier writes every block
a busy pool evicts, and Python work per block would cost the scheduler more
than the store saves. `hybridkv._native._codec` (C, built with the package)
does each batch in one call, copying and checksumming with the GIL released
so that the writer thread does not hold up the engine's; it also holds the
cpu:// store's map (`LruTable`, see lru.py). Without it the same functions
run in Python, giving the same bytes and choices (tests compare).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hybridkv.kv_cache.extensions import load_extension
from hybridkv.store.payload import BlockLayout, checksum

_codec, EXTENSION_ERROR = load_extension("hybridkv._native._codec")


def native(name: str) -> Any:
    """The C module's `name` (a type or function), or None without the module."""
    return getattr(_codec, name, None) if _codec is not None else None


def codec_backend() -> str:
    """"C" or "python (<why the C module is missing>)"."""
    return "C" if _codec is not None else f"python ({EXTENSION_ERROR})"


def encode_blocks(layout: BlockLayout, keys: list[bytes], data: np.ndarray) -> list[bytes]:
    """The stored values (`payload.encode_block`: header, then data) of the
    blocks under `keys`; `data` is uint8 `[num_layers, len(keys), layer_bytes]`,
    the i-th block being `data[:, i]`."""
    data = contiguous_blocks(layout, len(keys), data)
    encode = _codec.encode if _codec is not None else encode_blocks_raw
    return encode(layout.header_start, keys, data, layout.num_layers, layout.layer_bytes)


def encode_blocks_raw(header_start: bytes, keys: Sequence[bytes], data: Any, num_layers: int,
                      layer_bytes: int) -> list[bytes]:
    """`encode_blocks` in Python on a C-contiguous buffer (the reference of the C path)."""
    blocks = np.frombuffer(data, dtype=np.uint8).reshape(num_layers, len(keys), layer_bytes)
    out = []
    for i, key in enumerate(keys):
        block = blocks[:, i].tobytes()
        out.append(b"".join((header_start, checksum(key, block).to_bytes(8, "little"), block)))
    return out


def contiguous_blocks(layout: BlockLayout, n: int, data: np.ndarray) -> np.ndarray:
    """`data` checked to be n blocks of `layout` (uint8 `[num_layers, n,
    layer_bytes]`), C-contiguous (copied if it was not)."""
    if data.shape != (layout.num_layers, n, layout.layer_bytes) or data.dtype != np.uint8:
        raise ValueError(f"block data of shape {data.shape} ({data.dtype}) for {n} blocks "
                         f"of {layout.num_layers} x {layout.layer_bytes} bytes")
    return np.ascontiguousarray(data)


def eviction_recorder(always: list[bool], low: int, tails: list[Any]) -> Any:
    """The pool's eviction hook of a tier: `record(blocks)` keeps, of these
    evicted blocks, those worth storing: a block of group g when `always[g]`,
    its `value_hint` is not `low`, or its hash is in `tails[g]` (a set, a tuple
    of sets, or None); blocks without a hash (that cached nothing) are passed
    over. `take(g)` returns the group's kept (hashes, ids: native int64
    bytes), most recently evicted first, and empties them;
    `num_recorded` counts what is not taken yet. (C: no Python frame per call,
    no Python object per block.)"""
    cls = _codec.EvictionRecorder if _codec is not None else PyEvictionRecorder
    return cls(always, low, tails)


class PyEvictionRecorder:
    """The recorder in Python (the reference of the C path)."""

    def __init__(self, always: list[bool], low: int, tails: list[Any]) -> None:
        if len(tails) != len(always):
            raise ValueError("EvictionRecorder: one tails entry per group needed")
        self.always, self.low, self.tails = list(always), low, tails
        self._hashes: list[list[bytes]] = [[] for _ in always]
        self._ids: list[list[int]] = [[] for _ in always]
        self.num_recorded = 0

    def __call__(self, blocks: Sequence[Any]) -> None:
        for block in blocks:
            g, block_hash = block.group_id, block.block_hash
            if block_hash is None:  # cached nothing
                continue
            if self.always[g] or block.value_hint != self.low \
                    or _in_tails(self.tails[g], block_hash):
                self._hashes[g].append(block_hash)
                self._ids[g].append(block.block_id)
                self.num_recorded += 1

    def take(self, group_id: int) -> tuple[list[bytes], bytes]:
        hashes, ids = self._hashes[group_id][::-1], self._ids[group_id][::-1]
        self._hashes[group_id], self._ids[group_id] = [], []
        self.num_recorded -= len(ids)
        return hashes, np.array(ids, dtype=np.int64).tobytes()


def _in_tails(sets: Any, block_hash: bytes) -> bool:
    if sets is None:
        return False
    if isinstance(sets, tuple):
        return any(block_hash in s for s in sets)
    return block_hash in sets


def lru_table_class() -> Any:
    """The cpu store's map: `_codec.LruTable`, or `lru.LruDict` without the C module."""
    if _codec is not None:
        return _codec.LruTable
    from hybridkv.store.lru import LruDict
    return LruDict
