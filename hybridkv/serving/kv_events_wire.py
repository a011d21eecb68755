"""vLLM's KV event wire format: msgpack `KVEventBatch` payloads and ZMQ frames.

A publisher sends each batch as the multipart message `[topic, seq, payload]`
on a PUB socket: `seq` an 8-byte big-endian counter from 0, `payload` the
batch in msgpack. A ROUTER socket replays buffered batches: a client sends
`[b"", start]` (start: 8 bytes big-endian) and gets `[b"", topic, seq,
payload]` for every buffered batch with seq >= start, then
`[b"", b"", END_SEQ, b""]`.

Payload: an array `[ts, events, data_parallel_rank]`; each event a map whose
`type` names it (msgspec's tagged structs), fields omitted when they hold
their default None (the optional ones below)::

    {"type": "BlockStored", "block_hashes": [h, ...], "parent_block_hash": h | None,
     "token_ids": [...], "block_size": 16, "lora_id": None, "medium": "GPU",
     "lora_name": None, "extra_keys": [[salt], None, ...], "group_idx": 1,
     "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 32}
    {"type": "BlockRemoved", "block_hashes": [h, ...], "medium": "GPU", "group_idx": 1}
    {"type": "AllBlocksCleared"}

Hashes are bytes or ints (opaque to a consumer). `token_ids` are the tokens
of the blocks from the one after `parent_block_hash` on; `extra_keys` has
one entry per hash (the cache salt of a block 0, LoRA names, multimodal
items, untagged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

END_SEQ = (-1).to_bytes(8, "big", signed=True)
Hash = bytes | int


@dataclass(frozen=True, slots=True)
class WireBlockStored:
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True, slots=True)
class WireBlockRemoved:
    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class WireAllCleared:
    pass


WireEvent = WireBlockStored | WireBlockRemoved | WireAllCleared


@dataclass(frozen=True, slots=True)
class WireBatch:
    ts: float
    events: list[WireEvent] = field(default_factory=list)
    data_parallel_rank: int | None = None


_REQUIRED = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
             "BlockRemoved": ("block_hashes",), "AllBlocksCleared": ()}
_OPTIONAL = {"BlockStored": ("lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                             "kv_cache_spec_kind", "kv_cache_spec_sliding_window"),
             "BlockRemoved": ("medium", "group_idx"), "AllBlocksCleared": ()}
_CLASSES: dict[str, type] = {"BlockStored": WireBlockStored, "BlockRemoved": WireBlockRemoved,
                             "AllBlocksCleared": WireAllCleared}
# vLLM always writes these (fields without a default), even when None
_ALWAYS = {"BlockStored": ("lora_id", "medium", "lora_name"), "BlockRemoved": ("medium",),
           "AllBlocksCleared": ()}


def decode_batch(payload: bytes) -> WireBatch:
    """One msgpack payload -> WireBatch; ValueError naming what is malformed.
    Fields this module does not know (newer vLLM versions) are ignored."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as err:
        raise ValueError(f"KV event payload is not msgpack: {err}") from None
    if not isinstance(raw, list | tuple) or len(raw) < 2 or not isinstance(raw[1], list):
        raise ValueError(f"KV event batch must be [ts, events, ...], got {type(raw).__name__}")
    ts, events = raw[0], raw[1]
    if not isinstance(ts, int | float):
        raise ValueError(f"KV event batch ts must be a number, got {ts!r}")
    rank = raw[2] if len(raw) > 2 else None
    return WireBatch(float(ts), [_decode_event(i, e) for i, e in enumerate(events)], rank)


def _decode_event(i: int, raw: object) -> WireEvent:
    if not isinstance(raw, dict):
        raise ValueError(f"KV event {i} must be a map, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in _CLASSES:
        raise ValueError(f"KV event {i} has unknown type {kind!r}")
    missing = [name for name in _REQUIRED[kind] if name not in raw]
    if missing:
        raise ValueError(f"KV event {i} ({kind}) lacks {', '.join(missing)}")
    fields = {name: raw[name] for name in (*_REQUIRED[kind], *_OPTIONAL[kind]) if name in raw}
    event = _CLASSES[kind](**fields)
    _check_event(i, event)
    return event


def _check_event(i: int, event: WireEvent) -> None:
    if isinstance(event, WireAllCleared):
        return
    hashes = event.block_hashes
    if not isinstance(hashes, list) or not all(type(h) is bytes or type(h) is int
                                               for h in hashes):
        raise ValueError(f"KV event {i}: block_hashes must be a list of bytes or ints")
    if event.group_idx is not None and (type(event.group_idx) is not int
                                        or event.group_idx < 0):
        raise ValueError(f"KV event {i}: group_idx must be an int >= 0, got {event.group_idx!r}")
    if isinstance(event, WireBlockStored):
        if type(event.block_size) is not int or event.block_size < 1:
            raise ValueError(f"KV event {i}: block_size must be an int >= 1, "
                             f"got {event.block_size!r}")
        if not isinstance(event.token_ids, list) or \
                len(event.token_ids) < len(hashes) * event.block_size:
            raise ValueError(f"KV event {i}: token_ids must hold at least block_size tokens "
                             f"per hash ({len(hashes)} x {event.block_size})")


def encode_batch(batch: WireBatch) -> bytes:
    """WireBatch -> the msgpack payload vLLM's publisher would send for it."""
    events = [_encode_event(e) for e in batch.events]
    return msgpack.packb([batch.ts, events, batch.data_parallel_rank], use_bin_type=True)


def _encode_event(event: WireEvent) -> dict[str, Any]:
    kind = {WireBlockStored: "BlockStored", WireBlockRemoved: "BlockRemoved",
            WireAllCleared: "AllBlocksCleared"}[type(event)]
    out: dict[str, Any] = {"type": kind}
    for name in _REQUIRED[kind]:
        out[name] = getattr(event, name)
    for name in _OPTIONAL[kind]:
        value = getattr(event, name)
        if value is not None or name in _ALWAYS[kind]:
            out[name] = value
    return out


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def seq_from_bytes(raw: bytes) -> int:
    """8 bytes big-endian, signed (END_SEQ is -1); ValueError otherwise."""
    if len(raw) != 8:
        raise ValueError(f"KV event sequence number must be 8 bytes, got {len(raw)}")
    return int.from_bytes(raw, "big", signed=True)
