"""The stored form of one KV block: a fixed header, then the raw page bytes.

    magic "HKVB" | version u16 | group id u16 | layout fingerprint 16 B |
    dtype name 16 B | num_layers u32 | layer_bytes u32 | checksum u64 | data

All little-endian. `data` is `num_layers * layer_bytes` bytes: the block's
page in each layer of its group, in layer order (attention: K then V of the
block's tokens; Mamba: the state tensors). `checksum` is XXH3-64 of the data
seeded with XXH3-64 of the key, so a payload is bound to the key it was stored under:
a damaged value, a truncated one, or a valid block planted under another
key is rejected.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property

import xxhash

MAGIC = b"HKVB"
VERSION = 1
_HEADER = struct.Struct("<4sHH16s16sIIQ")
HEADER_BYTES = _HEADER.size


class PayloadError(ValueError):
    """A stored value is not a valid block for its key (`reason` says why)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason  # "corrupt" or "mismatch"


@dataclass(frozen=True)
class BlockLayout:
    """What one block of a group looks like: checked against every payload."""

    fingerprint: bytes  # 16 bytes: the model and its cache layout
    group_id: int
    dtype: str
    num_layers: int
    layer_bytes: int

    def __post_init__(self) -> None:
        if len(self.fingerprint) != 16:
            raise ValueError(f"BlockLayout.fingerprint must be 16 bytes, "
                             f"got {len(self.fingerprint)}")
        if len(self.dtype.encode()) > 16:
            raise ValueError(f"BlockLayout.dtype name {self.dtype!r} is longer than 16 bytes")

    @property
    def data_bytes(self) -> int:
        return self.num_layers * self.layer_bytes

    def header(self, checksum: int) -> bytes:
        return self.header_start + checksum.to_bytes(8, "little")

    @cached_property
    def header_start(self) -> bytes:
        """The header up to its checksum: the same for every block of the layout."""
        return _HEADER.pack(MAGIC, VERSION, self.group_id, self.fingerprint,
                            self.dtype.encode(), self.num_layers, self.layer_bytes, 0)[:-8]


def checksum(key: bytes, data: bytes | memoryview) -> int:
    """XXH3-64 of `data` seeded with XXH3-64 of `key` (binds the data to its key)."""
    return _xxh3(data, _xxh3(key))


_xxh3 = xxhash.xxh3_64_intdigest


def encode_block(layout: BlockLayout, key: bytes, data: bytes | memoryview) -> bytes:
    """Header + data for the block stored under `key`."""
    if len(data) != layout.data_bytes:
        raise ValueError(f"block data has {len(data)} bytes, the layout "
                         f"{layout.num_layers} x {layout.layer_bytes} needs {layout.data_bytes}")
    return b"".join((layout.header(checksum(key, data)), data))


def decode_block(layout: BlockLayout, key: bytes, value: bytes) -> memoryview:
    """The data of a stored value, checked; raises PayloadError.

    "mismatch": a valid header of another layout (model, group, dtype,
    shape); "corrupt": anything else (bad magic, truncated, checksum).
    """
    if len(value) < HEADER_BYTES:
        raise PayloadError("corrupt", f"{len(value)} bytes, shorter than the header")
    magic, version, group, fingerprint, dtype, layers, layer_bytes, stored = \
        _HEADER.unpack_from(value)
    if magic != MAGIC:
        raise PayloadError("corrupt", f"bad magic {magic!r}")
    if version != VERSION:
        raise PayloadError("mismatch", f"payload version {version}, expected {VERSION}")
    got = (fingerprint, group, dtype.rstrip(b"\0").decode(errors="replace"), layers, layer_bytes)
    want = (layout.fingerprint, layout.group_id, layout.dtype, layout.num_layers,
            layout.layer_bytes)
    if got != want:
        raise PayloadError("mismatch", f"layout (fingerprint, group, dtype, layers, bytes) "
                                       f"{got[1:]} != {want[1:]} or another model")
    data = memoryview(value)[HEADER_BYTES:]
    if len(data) != layout.data_bytes:
        raise PayloadError("corrupt", f"{len(data)} data bytes, expected {layout.data_bytes}")
    if checksum(key, data) != stored:
        raise PayloadError("corrupt", "checksum mismatch")
    return data
