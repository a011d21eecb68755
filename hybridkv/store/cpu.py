"""`cpu://?size=4GiB`: an in-process store bounded in bytes, least recently used out."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from hybridkv.store.base import KVStore, StoreStats
from hybridkv.store.codec import contiguous_blocks, lru_table_class
from hybridkv.store.lru import LruDict
from hybridkv.store.payload import BlockLayout

# bytes a stored entry costs beyond its key and value (table slot, bytes headers)
ENTRY_OVERHEAD = 96
_DIRECT = ("get", "contains", "prefix_length", "prefix_length_blocks", "contains_blocks",
           "put_pages")


class CpuStore(KVStore):
    """Payloads in a map in this process, evicting the least recently used.

    `capacity_bytes` bounds keys + values + ENTRY_OVERHEAD per entry. A run
    is inserted tail first, so its head is the most recent and is evicted
    last. `get` refreshes what it returns (and returns the stored objects, no
    copy); `contains` refreshes nothing. The map is `_codec.LruTable` (C) or,
    without the C module, `lru.LruDict`: the same behaviour.

    >>> s = CpuStore(1 << 20)
    >>> s.put([b"a", b"b"], [b"1", b"2"])
    2
    >>> s.get([b"a", b"x", b"b"])
    [b'1']
    """

    scheme = "cpu"
    inline_writes = True

    def __init__(self, capacity_bytes: int) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) \
                or capacity_bytes <= 0:
            raise ValueError(f"cpu store: size must be a positive number of bytes, "
                             f"got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        table = self._table = lru_table_class()(capacity_bytes, ENTRY_OVERHEAD)
        self._lock = threading.Lock()
        if not isinstance(table, LruDict):
            # the C table's calls hold the GIL throughout (but while filling new
            # values, which nothing else sees), so each is atomic: these go to it
            # straight, without a Python frame or the lock (unless overridden)
            for name in _DIRECT:
                if getattr(type(self), name) is getattr(CpuStore, name):
                    setattr(self, name, getattr(table, name))

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
        if len(keys) != len(values):
            raise ValueError(f"put: {len(keys)} keys but {len(values)} values")
        with self._lock:
            return self._table.put(keys, values)

    def put_blocks(self, layout: BlockLayout, key_prefix: bytes, hashes: Sequence[bytes],
                   data: np.ndarray) -> int:
        data = contiguous_blocks(layout, len(hashes), data)
        with self._lock:
            return self._table.put_encoded(layout.header_start, key_prefix, hashes, data,
                                           layout.num_layers, layout.layer_bytes)

    def get(self, keys: Sequence[bytes]) -> list[bytes]:
        with self._lock:
            return self._table.get(keys)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        with self._lock:
            return self._table.contains(keys)

    def prefix_length(self, keys: Sequence[bytes]) -> int:
        with self._lock:
            return self._table.prefix_length(keys)

    def put_pages(self, layout: BlockLayout, key_prefix: bytes, hashes: Sequence[bytes],
                  ids: bytes, views: list[np.ndarray]) -> int:
        with self._lock:
            return self._table.put_from_pages(layout.header_start, key_prefix, hashes, ids,
                                              views, layout.layer_bytes)

    def prefix_length_blocks(self, key_prefix: bytes, hashes: Sequence[bytes]) -> int:
        with self._lock:
            return self._table.prefix_length_blocks(key_prefix, hashes)

    def contains_blocks(self, key_prefix: bytes, hashes: Sequence[bytes]) -> list[bool]:
        with self._lock:
            return self._table.contains_blocks(key_prefix, hashes)

    def delete(self, keys: Sequence[bytes]) -> int:
        with self._lock:
            return self._table.delete(keys)

    def keys(self) -> list[bytes]:
        """The stored keys, least recently used first."""
        with self._lock:
            return self._table.keys()

    def stats(self) -> StoreStats:
        entries, used, evicted = self._table.stats()
        return StoreStats("cpu", entries, used, self.capacity_bytes, evicted)

    def describe(self) -> str:
        return f"cpu://?size={self.capacity_bytes}"

