"""LruDict: the cpu:// store's map in Python (the reference of `_codec.LruTable`).

Byte keys -> bytes values, bounded in bytes: each entry costs its key, its
value and a fixed `overhead`. `put` inserts a run tail first, so its head is
the most recent and is evicted last; a stored key is replaced and refreshed,
an entry larger than the capacity is skipped, and then the least recently
used entries go until the rest fits. `get` returns the values of the longest
stored prefix and refreshes them (the head ends most recent); `contains` and
`prefix_length` refresh nothing. The C table does the same (tests compare
the two with an oracle), a few times faster per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from hybridkv.store.base import leading_count, pop_entry
from hybridkv.store.codec import encode_blocks_raw


class LruDict:
    """`LruTable(capacity, overhead)` in Python."""

    def __init__(self, capacity: int, overhead: int) -> None:
        self.capacity = capacity
        self.overhead = overhead
        self._data: OrderedDict[bytes, bytes] = OrderedDict()
        self._used = 0
        self._evicted = 0

    def __len__(self) -> int:
        return len(self._data)

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
        if len(keys) != len(values):
            raise ValueError(f"put: {len(keys)} keys but {len(values)} values")
        data, overhead, stored = self._data, self.overhead, 0
        for key, value in zip(reversed(keys), reversed(values)):
            cost = len(key) + len(value) + overhead
            if cost > self.capacity:
                continue
            self._used -= pop_entry(data, key, overhead)
            data[key] = value
            self._used += cost
            stored += 1
        while self._used > self.capacity:
            key, value = data.popitem(last=False)
            self._used -= len(key) + len(value) + overhead
            self._evicted += 1
        return stored

    def put_encoded(self, header_start: bytes, prefix: bytes, hashes: Sequence[bytes],
                    data: np.ndarray, num_layers: int, layer_bytes: int) -> int:
        keys = [prefix + h for h in hashes]
        return self.put(keys, encode_blocks_raw(header_start, keys, data, num_layers,
                                                layer_bytes))

    def put_from_pages(self, header_start: bytes, prefix: bytes, hashes: Sequence[bytes],
                       ids: bytes, views: list[np.ndarray], layer_bytes: int) -> int:
        rows = np.frombuffer(ids, dtype=np.int64)
        data = np.stack([v.reshape(v.shape[0], -1).view(np.uint8)[rows, :layer_bytes]
                         for v in views])
        return self.put_encoded(header_start, prefix, hashes, data, len(views), layer_bytes)

    def get(self, keys: Sequence[bytes]) -> list[bytes]:
        data, out = self._data, []
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
        return leading_count(map(self._data.__contains__, keys))

    def prefix_length_blocks(self, prefix: bytes, hashes: Sequence[bytes]) -> int:
        return self.prefix_length([prefix + h for h in hashes])

    def contains_blocks(self, prefix: bytes, hashes: Sequence[bytes]) -> list[bool]:
        return self.contains([prefix + h for h in hashes])

    def delete(self, keys: Sequence[bytes]) -> int:
        freed = [pop_entry(self._data, key, self.overhead) for key in keys]
        self._used -= sum(freed)
        return sum(map(bool, freed))

    def keys(self) -> list[bytes]:
        """The stored keys, least recently used first."""
        return list(self._data)

    def stats(self) -> tuple[int, int, int]:
        """(entries, used bytes, evicted entries)."""
        return len(self._data), self._used, self._evicted
