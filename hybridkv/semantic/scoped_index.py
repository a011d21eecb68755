"""Per-scope lookup structures kept in process: the exact-match map and one
ANN index per scope, so a search never even sees another tenant's entries."""

from __future__ import annotations

import numpy as np

from hybridkv.semantic.index import VectorIndex


class ScopedIndex:
    """id -> (scope, key); (scope, key) -> id; scope -> VectorIndex."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.scope_to_index: dict[str, VectorIndex] = {}
        self.exact_to_id: dict[tuple[str, str], int] = {}
        self.id_to_place: dict[int, tuple[str, str]] = {}

    def __len__(self) -> int:
        return len(self.id_to_place)

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self.id_to_place

    def add(self, entry_id: int, scope: str, key: str, vector: np.ndarray) -> None:
        """Index an entry (a newer entry with the same exact key replaces the older
        one in the exact map; both stay searchable until removed)."""
        index = self.scope_to_index.get(scope)
        if index is None:
            index = self.scope_to_index[scope] = VectorIndex(self.dim)
        index.add(entry_id, vector)
        self.exact_to_id[(scope, key)] = entry_id
        self.id_to_place[entry_id] = (scope, key)

    def remove(self, entry_id: int) -> None:
        place = self.id_to_place.pop(entry_id, None)
        if place is None:
            return
        scope, key = place
        if self.exact_to_id.get(place) == entry_id:
            del self.exact_to_id[place]
        index = self.scope_to_index[scope]
        index.remove(entry_id)
        if len(index) == 0:
            del self.scope_to_index[scope]

    def exact(self, scope: str, key: str) -> int | None:
        return self.exact_to_id.get((scope, key))

    def search(self, scope: str, vector: np.ndarray, count: int) -> list[tuple[int, float]]:
        """Nearest entries of `scope` as (id, similarity), best first."""
        index = self.scope_to_index.get(scope)
        return [] if index is None else index.search(vector, count)
