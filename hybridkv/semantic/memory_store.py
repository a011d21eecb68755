"""`memory://`: entries in this process, bounded in count (least recently used
leaves first) and in age (TTL)."""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from hybridkv.semantic.entry import Entry
from hybridkv.semantic.scoped_index import ScopedIndex


class MemoryStore:
    """`put`, `get` (touches), `exact`, `search`; `num_evictions` counts entries
    removed for room or age."""

    def __init__(self, dim: int, *, max_entries: int, ttl_seconds: float,
                 clock=time.time) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be > 0, got {ttl_seconds}")
        self.max_entries = max_entries
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.index = ScopedIndex(dim)
        self.id_to_entry: OrderedDict[int, Entry] = OrderedDict()  # LRU first
        self.num_evictions = 0

    def __len__(self) -> int:
        return len(self.id_to_entry)

    def put(self, entry: Entry) -> None:
        """Store `entry` as the most recently used; evicts the least recently used
        beyond `max_entries`."""
        old = self.index.exact(entry.scope, entry.key)
        if old is not None:
            self._drop(old)
        self.id_to_entry[entry.id] = entry
        self.index.add(entry.id, entry.scope, entry.key, entry.vector)
        while len(self.id_to_entry) > self.max_entries:
            self._drop(next(iter(self.id_to_entry)))
            self.num_evictions += 1

    def get(self, entry_id: int) -> Entry | None:
        """The live entry (now most recently used), or None (expired entries go)."""
        entry = self.id_to_entry.get(entry_id)
        if entry is None:
            return None
        if self.clock() - entry.created > self.ttl_seconds:
            self._drop(entry_id)
            self.num_evictions += 1
            return None
        self.id_to_entry.move_to_end(entry_id)
        return entry

    def exact(self, scope: str, key: str) -> int | None:
        return self.index.exact(scope, key)

    def search(self, scope: str, vector: np.ndarray, count: int) -> list[tuple[int, float]]:
        return self.index.search(scope, vector, count)

    def _drop(self, entry_id: int) -> None:
        self.id_to_entry.pop(entry_id, None)
        self.index.remove(entry_id)

    def close(self) -> None:
        """Nothing to release."""
