"""An approximate nearest-neighbour index over unit vectors (usearch HNSW,
inner product): `add`, `remove`, `search`, one per tenant scope.

usearch was picked over faiss-cpu and hnswlib by `benchmarks/bench_semantic_cache.py`
(lookup latency at 10k-1M entries) and because it installs as a small wheel
with removals built in.
"""

from __future__ import annotations

import numpy as np

CONNECTIVITY = 16
EXPANSION_ADD = 64
EXPANSION_SEARCH = 48


class VectorIndex:
    """Keys (non-negative ints) to unit vectors; `search` gives the nearest keys
    with their cosine similarity, best first."""

    def __init__(self, dim: int) -> None:
        from usearch.index import Index

        self.dim = dim
        self._index = Index(ndim=dim, metric="ip", dtype="f32", connectivity=CONNECTIVITY,
                            expansion_add=EXPANSION_ADD, expansion_search=EXPANSION_SEARCH)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: int) -> bool:
        return key in self._index

    def add(self, key: int, vector: np.ndarray) -> None:
        """Insert (or replace) `key`; `vector` is [dim] float32 of unit length."""
        if key in self._index:
            self._index.remove(key)
        self._index.add(key, np.asarray(vector, np.float32))

    def add_many(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Bulk insert of new keys ([N] uint64, [N, dim] float32)."""
        self._index.add(keys, vectors)

    def remove(self, key: int) -> None:
        if key in self._index:
            self._index.remove(key)

    def search(self, vector: np.ndarray, count: int = 4) -> list[tuple[int, float]]:
        """The `count` nearest keys as (key, cosine similarity), best first."""
        if len(self._index) == 0:
            return []
        found = self._index.search(np.asarray(vector, np.float32), count)
        return [(int(k), 1.0 - float(d)) for k, d in zip(found.keys, found.distances)]
