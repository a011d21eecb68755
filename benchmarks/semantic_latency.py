"""Lookup latency of the semantic cache at N entries, for bench_semantic_cache.py.

An in-memory cache is filled with N synthetic unit vectors in one scope; the
product's `SemanticCache.lookup` (embedding a real question + exact map +
usearch search + vetoes) and the ANN search alone are timed, rounds of
`lookups` after 100 warm-up lookups; p50 / p99 per round and the median of
the rounds. `lookup_cpu` is the same lookup in thread CPU time: on a shared,
loaded machine the wall-clock p99 is mostly time the thread waited for a core.

Building the HNSW graph is the slow part (about 1,500 random 256-d inserts a
second per core here), so `index_dir` keeps each size's graph on disk
(usearch's own `save` / `load`, the vectors regenerated from a fixed seed):
a later run loads the same graph instead of rebuilding it. Only the build is
cached; the index searched is the product's `VectorIndex` with its
parameters, and every lookup goes through the product's code.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np

from hybridkv.semantic.cache import SemanticCache
from hybridkv.semantic.entry import Entry
from hybridkv.semantic.index import CONNECTIVITY, EXPANSION_SEARCH, VectorIndex
from hybridkv.semantic.labeled_pairs import questions
from hybridkv.semantic.memory_store import MemoryStore
from hybridkv.semantic.thresholds import ThresholdPolicy

DEFAULT_THRESHOLD = 0.9
WARM_UP = 100


def synthetic_vectors(size: int, dim: int) -> np.ndarray:
    """[size, dim] float32 unit rows, the same for a given size on every run."""
    rng = np.random.default_rng(size)
    vectors = rng.standard_normal((size, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def built_index(vectors: np.ndarray, index_dir: str | None) -> tuple[VectorIndex, str]:
    """The product's index over `vectors` (keys 1..N): loaded from `index_dir`
    when a graph of this size was saved there, else built (bulk add) and saved."""
    size, dim = vectors.shape
    index = VectorIndex(dim)
    path = os.path.join(index_dir, f"usearch-{size}x{dim}.bin") if index_dir else None
    if path and os.path.exists(path):
        index._index.load(path)
        assert len(index) == size, f"{path} holds {len(index)} vectors, not {size}"
        return index, "loaded"
    index.add_many(np.arange(1, size + 1, dtype=np.uint64), vectors)
    if path:
        os.makedirs(index_dir, exist_ok=True)  # type: ignore[arg-type]
        index._index.save(path)
    return index, "built"


def filled_cache(embedder, vectors: np.ndarray, index: VectorIndex) -> SemanticCache:
    """A memory cache whose one scope holds an entry per row of `vectors`."""
    size = len(vectors)
    store = MemoryStore(embedder.dim, max_entries=size + 10, ttl_seconds=1e9)
    store.index.scope_to_index["s"] = index
    now = time.time()
    for k in range(1, size + 1):
        store.id_to_entry[k] = Entry(k, "s", f"q{k}", f"question {k}", vectors[k - 1], "a",
                                     created=now)
        store.index.id_to_place[k] = ("s", f"q{k}")
        store.index.exact_to_id[("s", f"q{k}")] = k
    return SemanticCache(store, embedder, ThresholdPolicy(DEFAULT_THRESHOLD))


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"p50_ms": 1e3 * ordered[len(ordered) // 2],
            "p99_ms": 1e3 * ordered[int(0.99 * (len(ordered) - 1))]}


def time_round(cache: SemanticCache, index: VectorIndex, texts: list[str],
               queries: np.ndarray, lookups: int) -> dict:
    """One round: full lookups (wall and thread CPU) alternated with bare ANN searches."""
    full, ann, cpu = [], [], []
    for i in range(lookups + WARM_UP):
        c0, t0 = time.thread_time(), time.perf_counter()
        cache.lookup("s", texts[i % len(texts)])
        t1, c1 = time.perf_counter(), time.thread_time()
        index.search(queries[i % len(queries)], 4)
        t2 = time.perf_counter()
        if i >= WARM_UP:
            full.append(t1 - t0)
            cpu.append(c1 - c0)
            ann.append(t2 - t1)
    return {"lookup": percentiles(full), "ann_search": percentiles(ann),
            "lookup_cpu": percentiles(cpu)}


def latency(embedder, sizes: list[int], lookups: int, rounds: int, compare: bool,
            index_dir: str | None = None) -> list:
    """One row per size: build (or load) time, rounds, medians of p50 / p99."""
    texts = [q.text for g in questions(1, 20) for q in g]
    queries = embedder.embed(texts)
    out = []
    for size in sizes:
        vectors = synthetic_vectors(size, embedder.dim)
        start = time.perf_counter()
        index, how = built_index(vectors, index_dir)
        graph_s = time.perf_counter() - start
        cache = filled_cache(embedder, vectors, index)
        row: dict = {"entries": size, "index": how, "index_s": round(graph_s, 1),
                     "fill_s": round(time.perf_counter() - start - graph_s, 1),
                     "load_average_before": os.getloadavg(), "rounds": [
                         time_round(cache, index, texts, queries, lookups)
                         for _ in range(rounds)]}
        row["load_average_after"] = os.getloadavg()
        for part in ("lookup", "ann_search", "lookup_cpu"):
            for q in ("p50_ms", "p99_ms"):
                values = [x[part][q] for x in row["rounds"]]
                row[f"{part}_{q}_median"] = statistics.median(values)
                row[f"{part}_{q}_range"] = (min(values), max(values))
        if compare:
            row["ann_compare"] = ann_compare(index, vectors, lookups)
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
        del cache, vectors, index
    return out


def ann_compare(index: VectorIndex, vectors: np.ndarray, lookups: int) -> dict:
    """usearch against faiss HNSW (same M / efSearch): p50 / p99 and recall@1
    against brute force."""
    rng = np.random.default_rng(1)
    near = vectors[rng.integers(0, len(vectors), lookups)]
    queries = near + 0.3 * rng.standard_normal(near.shape, dtype=np.float32) / 16
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    truth = [int(np.argmax(vectors @ q)) + 1 for q in queries[:200]]
    result = {"usearch": _time_ann(lambda q: index.search(q, 1)[0][0], queries, truth)}
    try:
        import faiss
    except ImportError:
        result["faiss"] = "faiss-cpu not installed"
        return result
    start = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(vectors.shape[1], CONNECTIVITY, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(vectors)
    hnsw.hnsw.efSearch = EXPANSION_SEARCH
    built = time.perf_counter() - start
    result["faiss_hnsw"] = {**_time_ann(lambda q: int(hnsw.search(q[None], 1)[1][0, 0]) + 1,
                                        queries, truth), "build_s": round(built, 1)}
    return result


def _time_ann(search, queries, truth) -> dict:
    times = []
    for q in queries:
        t0 = time.perf_counter()
        search(q)
        times.append(time.perf_counter() - t0)
    hits = sum(search(q) == t for q, t in zip(queries[:200], truth))
    return {**percentiles(times), "recall_at_1": hits / len(truth)}
