"""Per-batch work of the KV tier: encoding stored values, selecting evicted blocks.

Both run once per batch rather than once per block: a tier writes every block
a busy pool evicts, and Python work per block would cost the scheduler more
than the store saves. `hybridkv.store._codec` (C, built with the package)
does each batch in one call, copying and checksumming with the GIL released
so that the writer thread does not hold up the engine's; it also holds the
cpu:// store's map (`LruTable`, see lru.py). Without it the same functions
run in Python, giving the same bytes and choices (tests compare).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from hybridkv.store.payload import BlockLayout, checksum


def _load_extension() -> tuple[Any, str | None]:
    """(the C module, None) or (None, why it is missing)."""
    try:
        return importlib.import_module("hybridkv.store._codec"), None
    except ImportError as e:
        return None, str(e)


_codec, EXTENSION_ERROR = _load_extension()


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


def eviction_recorder(always: list[bool], low: int, tails: list[Any],
                      hashes_out: list[list[bytes]], ids_out: list[list[int]]
                      ) -> Callable[[Sequence[Any]], int]:
    """`record(blocks)`, the pool's eviction hook: of these evicted blocks, note
    those worth storing: a block of group g when `always[g]`, its `value_hint`
    is not `low`, or its hash is in `tails[g]` (a set, a tuple of sets, or
    None); its hash goes to `hashes_out[g]` (the list there when called), its
    id to `ids_out[g]`. Returns how many. (C: no Python frame per call.)"""
    if _codec is not None:
        return _codec.EvictionRecorder(always, low, tails, hashes_out, ids_out)  # type: ignore[no-any-return]
    return partial(record_evicted_python, always, low, tails, hashes_out, ids_out)


def record_evicted_python(always: list[bool], low: int, tails: list[Any],
                          hashes_out: list[list[bytes]], ids_out: list[list[int]],
                          blocks: Sequence[Any]) -> int:
    """The recorder in Python (the reference of the C path)."""
    kept = 0
    for block in blocks:
        g, block_hash = block.group_id, block.block_hash
        if always[g] or block.value_hint != low or _in_tails(tails[g], block_hash):
            hashes_out[g].append(block_hash)
            ids_out[g].append(block.block_id)
            kept += 1
    return kept


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
