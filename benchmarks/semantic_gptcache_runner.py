"""GPTCache on the same labeled stream and the same embeddings, for
bench_semantic_cache.py. Runs in a venv of its own (GPTCache pins packages
the project does not want):

    python -m venv /tmp/gptcache-venv
    /tmp/gptcache-venv/bin/pip install gptcache==0.1.44 faiss-cpu numpy sqlalchemy
    /tmp/gptcache-venv/bin/python benchmarks/semantic_gptcache_runner.py IN_DIR OUT.json

IN_DIR holds `stream.json` ([[text, label], ...]), `texts.json` and
`vectors.npy` (the embedding of each text, unit rows). For each similarity
threshold, one fresh GPTCache set up as its README does: `get_data_manager`
with `CacheBase("sqlite")` and `VectorBase("faiss")` (an `IDMap,Flat` L2
index, top_k 1), `SearchDistanceEvaluation()` (max distance 4: a hit when
4 - squared L2 >= 4 * threshold, i.e. cosine >= 2 * threshold - 1 on unit
vectors), `get_prompt`, and our embedding function. The protocol is
semantic_eval's: a get that returns an answer is a served hit, right when
the label matches; otherwise the answer is put.

Three settings differ from its defaults, none of them in how it decides a
hit: the sqlite database is in memory (a file database commits to disk on
every put and every hit, about 16 ms each here); faiss searches on one
thread (its OpenMP threads spin against each other on a busy 2-core machine:
about 20 ms per brute-force search of a few hundred vectors); and
`max_size` is larger than the stream, so that, like ours, it never evicts
(the default, 1,000 entries, would drop entries of a 3,400-question stream).
"""

import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
from gptcache import Cache, Config
from gptcache.adapter.api import get, put
from gptcache.manager import CacheBase, VectorBase, get_data_manager
from gptcache.processor.pre import get_prompt
from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation

# the cosines of bench_semantic_cache.THRESHOLDS, 0.8 ... 0.995
THRESHOLDS = (0.9, 0.925, 0.9375, 0.95, 0.9625, 0.975, 0.985, 0.99, 0.995, 0.9975)


def fresh_cache(table, threshold: float, workdir: str, size: int) -> Cache:
    cache = Cache()
    dm = get_data_manager(CacheBase("sqlite", sql_url="sqlite:///:memory:"),
                          VectorBase("faiss", dimension=table.dim,
                                     index_path=f"{workdir}/{threshold}.faiss"),
                          max_size=size)
    cache.init(pre_embedding_func=get_prompt, embedding_func=table.embed, data_manager=dm,
               similarity_evaluation=SearchDistanceEvaluation(),
               config=Config(similarity_threshold=threshold))
    return cache


def run(stream, table, threshold, workdir):
    cache = fresh_cache(table, threshold, workdir, 2 * len(stream) + 10)
    served = false_hits = right = reachable = 0
    stored = set()
    start = time.perf_counter()
    for text, label in stream:
        reachable += label in stored
        answer = get(text, cache_obj=cache)
        if answer is not None:
            served += 1
            false_hits += answer != label
            right += answer == label
            continue
        put(text, label, cache_obj=cache)
        stored.add(label)
    seconds = time.perf_counter() - start
    cache.data_manager.close()
    return {"threshold": threshold, "cosine_equivalent": round(2 * threshold - 1, 4),
            "served": served, "false_hits": false_hits, "right": right,
            "false_hit_rate": round(false_hits / served, 4) if served else 0.0,
            "recall": round(right / reachable, 4) if reachable else 0.0,
            "reachable": reachable, "questions": len(stream), "seconds": round(seconds, 1)}


class Table:
    def __init__(self, texts, vectors):
        self.row = {t: i for i, t in enumerate(texts)}
        self.vectors = vectors.astype(np.float32)
        self.dim = vectors.shape[1]

    def embed(self, text, **_):
        return self.vectors[self.row[text]]


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    faiss.omp_set_num_threads(1)
    stream = json.loads((src / "stream.json").read_text())
    table = Table(json.loads((src / "texts.json").read_text()), np.load(src / "vectors.npy"))
    workdir = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, workdir, True)  # after GPTCache's own exit flushes
    rows = []
    for t in THRESHOLDS:
        rows.append(run(stream, table, t, workdir))
        print(json.dumps(rows[-1]), flush=True)
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
