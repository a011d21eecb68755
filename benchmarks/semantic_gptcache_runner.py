"""GPTCache on the same labeled stream and the same embeddings, for
bench_semantic_cache.py. Runs in a venv of its own (GPTCache pins packages
the project does not want):

    python -m venv /tmp/gptcache-venv
    /tmp/gptcache-venv/bin/pip install gptcache==0.1.44 faiss-cpu numpy sqlalchemy
    /tmp/gptcache-venv/bin/python benchmarks/semantic_gptcache_runner.py IN_DIR OUT.json

IN_DIR holds `stream.json` ([[text, label], ...]), `texts.json` and
`vectors.npy` (the embedding of each text, unit rows). GPTCache is set up as
its README does (sqlite + faiss, SearchDistanceEvaluation; both files in a
fresh temporary folder per run, so no run sees another's index), with our
embedding function, for each of its similarity thresholds; the same protocol
as semantic_eval: a get that returns an answer is a served hit, right when
the label matches; otherwise the answer is put.
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from gptcache import Cache, Config
from gptcache.adapter.api import get, put
from gptcache.manager import CacheBase, VectorBase, get_data_manager
from gptcache.processor.pre import get_prompt
from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation

THRESHOLDS = (0.9, 0.925, 0.95, 0.9625, 0.975, 0.985, 0.995)  # cosine 0.8 ... 0.99


def run(stream, table, threshold, workdir):
    cache = Cache()
    dm = get_data_manager(CacheBase("sqlite", sql_url=f"sqlite:///{workdir}/{threshold}.db"),
                          VectorBase("faiss", dimension=table.dim,
                                     index_path=f"{workdir}/{threshold}.faiss"))
    cache.init(pre_embedding_func=get_prompt, embedding_func=table.embed, data_manager=dm,
               similarity_evaluation=SearchDistanceEvaluation(),
               config=Config(similarity_threshold=threshold))
    served = false_hits = right = reachable = 0
    stored = set()
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
    return {"threshold": threshold, "cosine_equivalent": round(2 * threshold - 1, 4),
            "served": served, "false_hits": false_hits,
            "false_hit_rate": round(false_hits / served, 4) if served else 0.0,
            "recall": round(right / reachable, 4) if reachable else 0.0,
            "reachable": reachable, "questions": len(stream)}


class Table:
    def __init__(self, texts, vectors):
        self.row = {t: i for i, t in enumerate(texts)}
        self.vectors = vectors.astype(np.float32)
        self.dim = vectors.shape[1]

    def embed(self, text, **_):
        return self.vectors[self.row[text]]


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    stream = json.loads((src / "stream.json").read_text())
    table = Table(json.loads((src / "texts.json").read_text()), np.load(src / "vectors.npy"))
    with tempfile.TemporaryDirectory() as workdir:
        rows = [run(stream, table, t, workdir) for t in THRESHOLDS]
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
