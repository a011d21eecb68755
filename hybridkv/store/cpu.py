"""`cpu://?size=4GiB`: an in-process store bounded in bytes, least recently used out."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from hybridkv.store.base import KVStore, StoreStats

# bytes a stored entry costs beyond its key and value (dict slot, bytes headers)
ENTRY_OVERHEAD = 96


class CpuStore(KVStore):
    """Payloads in a dict in this process, evicting the least recently used.

    `capacity_bytes` bounds keys + values + ENTRY_OVERHEAD per entry. A run
    is inserted tail first, so its head is the most recent and is evicted
    last. `get` refreshes what it returns; `contains` refreshes nothing.

    >>> s = CpuStore(1 << 20)
    >>> s.put([b"a", b"b"], [b"1", b"2"])
    2
    >>> s.get([b"a", b"x", b"b"])
    [b'1']
    """

    scheme = "cpu"

    def __init__(self, capacity_bytes: int) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) \
                or capacity_bytes <= 0:
            raise ValueError(f"cpu store: size must be a positive number of bytes, "
                             f"got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        self._data: OrderedDict[bytes, bytes] = OrderedDict()
        self._used = 0
        self._evicted = 0
        self._lock = threading.Lock()

    @staticmethod
    def _cost(key: bytes, value: bytes) -> int:
        return len(key) + len(value) + ENTRY_OVERHEAD

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
        if len(keys) != len(values):
            raise ValueError(f"put: {len(keys)} keys but {len(values)} values")
        stored, capacity, used = 0, self.capacity_bytes, 0
        with self._lock:
            data = self._data
            for key, value in zip(reversed(keys), reversed(values)):
                cost = len(key) + len(value) + ENTRY_OVERHEAD
                if cost > capacity:
                    continue
                old = data.pop(key, None)
                if old is not None:
                    used -= len(key) + len(old) + ENTRY_OVERHEAD
                data[key] = value
                used += cost
                stored += 1
            self._used += used
            self._evict()
        return stored

    def _evict(self) -> None:
        data = self._data
        while self._used > self.capacity_bytes:
            key, value = data.popitem(last=False)
            self._used -= self._cost(key, value)
            self._evicted += 1

    def get(self, keys: Sequence[bytes]) -> list[bytes]:
        out: list[bytes] = []
        with self._lock:
            data = self._data
            for key in keys:
                value = data.get(key)
                if value is None:
                    break
                out.append(value)
            for key in reversed(keys[:len(out)]):  # the head ends most recent
                data.move_to_end(key)
        return out

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        data = self._data
        return [key in data for key in keys]

    def prefix_length(self, keys: Sequence[bytes]) -> int:
        data = self._data
        n = 0
        for key in keys:
            if key not in data:
                break
            n += 1
        return n

    def delete(self, keys: Sequence[bytes]) -> int:
        removed = 0
        with self._lock:
            for key in keys:
                value = self._data.pop(key, None)
                if value is not None:
                    self._used -= self._cost(key, value)
                    removed += 1
        return removed

    def stats(self) -> StoreStats:
        return StoreStats("cpu", len(self._data), self._used, self.capacity_bytes, self._evicted)

    def describe(self) -> str:
        return f"cpu://?size={self.capacity_bytes}"
