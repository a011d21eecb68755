"""The KV store interface: a second tier of KV blocks behind the device pool.

A store maps byte keys to byte payloads. Keys of one request's blocks form a
chain (each block's hash covers every block before it), so the queries a KV
cache needs are prefix queries: the longest stored prefix of a run of keys,
with or without reading the payloads. Stores are bounded and evict on their
own; a key that was put may be gone later.

Backends raise `StoreError` (or a subclass) for anything the store itself
cannot do: unreachable, timed out, full, I/O failure. Callers treat every
such error as a miss (recompute), never as a reason to fail a request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass

import numpy as np

from hybridkv.store.codec import encode_blocks
from hybridkv.store.payload import BlockLayout


class StoreError(Exception):
    """The store could not serve a call (down, timed out, I/O failure)."""


class StoreFull(StoreError):
    """The store refused a write because it has no room (and does not evict)."""


@dataclass
class StoreStats:
    """What a store holds now and what it has done (cumulative counters).

    `capacity_bytes` is None when the store does not know its bound (a
    Redis server sizes itself); `used_bytes` then counts what this client
    wrote that it knows of, or what the server reports.
    """

    backend: str
    keys: int = 0
    used_bytes: int = 0
    capacity_bytes: int | None = None
    evicted_keys: int = 0


class KVStore(ABC):
    """Byte payloads under byte keys, with prefix queries over chains of keys.

    Every method takes keys in chain order (the head of a prefix first). A
    store that must evict drops later keys of a run before earlier ones
    among equally recent data, so that what remains is still a prefix.
    Implementations are safe to call from two threads (a background writer
    and the engine).
    """

    #: the URL scheme, e.g. "cpu"
    scheme: str = ""
    #: puts do no I/O and return at once (memory only): a tier may write a small
    #: batch from the engine's thread instead of handing it to its writer thread
    inline_writes: bool = False
    #: other instances read and write the same blocks (Redis; a `file://` directory
    #: opened with `?shared=1`): a tier writes blocks when they are computed, not only
    #: when its pool evicts them, so the others can load what this one still holds
    shared: bool = False

    @abstractmethod
    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
        """Store `values[i]` under `keys[i]`; return how many were stored.

        A key already stored is refreshed (its value replaced). A value
        larger than the whole store is skipped. Raises StoreError.
        """

    def put_blocks(self, layout: BlockLayout, key_prefix: bytes, hashes: Sequence[bytes],
                   data: np.ndarray) -> int:
        """Store a batch of KV blocks of one group: block i (`data[:, i]`, uint8
        `[num_layers, n, layer_bytes]`) encoded (`payload.encode_block`) under
        `key_prefix + hashes[i]`, as `put` does. Stores may do it in one call
        (the cpu store does: no per-block Python objects but the values)."""
        keys = [key_prefix + h for h in hashes]
        return self.put(keys, encode_blocks(layout, keys, data))

    def put_pages(self, layout: BlockLayout, key_prefix: bytes, hashes: Sequence[bytes],
                  ids: bytes, views: list[np.ndarray]) -> int:
        """`put_blocks` of blocks still in the pages: block i is row `ids[i]`
        (native int64 bytes) of each layer's view (2-D, a row per block id; its
        first `layout.layer_bytes` bytes are the data). The cpu store encodes
        them from there, with no copy in between."""
        rows = np.frombuffer(ids, dtype=np.int64)
        data = np.stack([v.reshape(v.shape[0], -1).view(np.uint8)[rows, :layout.layer_bytes]
                         for v in views])
        return self.put_blocks(layout, key_prefix, hashes, data)

    @abstractmethod
    def get(self, keys: Sequence[bytes]) -> list[bytes]:
        """Payloads of the longest stored prefix of `keys` (refreshing them).

        `get([k0, k1, k2])` with k1 missing -> `[v0]`. Raises StoreError.
        """

    @abstractmethod
    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored, reading no payload and refreshing nothing."""

    def prefix_length(self, keys: Sequence[bytes]) -> int:
        """How many leading keys are stored (a query: refreshes nothing)."""
        return leading_count(self.contains(keys))

    def prefix_length_blocks(self, key_prefix: bytes, hashes: Sequence[bytes]) -> int:
        """`prefix_length` of the keys `key_prefix + h` (stores may skip building them)."""
        return self.prefix_length([key_prefix + h for h in hashes])

    def contains_blocks(self, key_prefix: bytes, hashes: Sequence[bytes]) -> list[bool]:
        """`contains` of the keys `key_prefix + h` (stores may skip building them)."""
        return self.contains([key_prefix + h for h in hashes])

    @abstractmethod
    def delete(self, keys: Sequence[bytes]) -> int:
        """Remove these keys; return how many were stored. Raises StoreError."""

    @abstractmethod
    def stats(self) -> StoreStats:
        """Current size and counters."""

    def flush(self) -> None:  # noqa: B027 - optional for stores that write at once
        """Make everything put so far durable (and visible to other processes)."""

    def close(self) -> None:  # noqa: B027 - optional for stores holding nothing open
        """Release connections and files; the store is unusable afterwards."""

    def describe(self) -> str:
        """A URL-like description for messages (no credentials)."""
        return f"{self.scheme}://"


def leading_count(flags: Iterable[object]) -> int:
    """How many leading items are true: the stored prefix of a run of keys,
    given whether each is stored (lazily, so that the first missing ends it).

    >>> leading_count(k in {b"a", b"b"} for k in (b"a", b"b", b"x", b"a"))
    2
    """
    n = 0
    for flag in flags:
        if not flag:
            break
        n += 1
    return n


def pop_entry(table: MutableMapping[bytes, bytes], key: bytes, overhead: int = 0) -> int:
    """Remove `key` from an in-memory table of values; the bytes it took (key,
    value and `overhead`), or 0 when it was not there."""
    value = table.pop(key, None)
    return 0 if value is None else len(key) + len(value) + overhead
