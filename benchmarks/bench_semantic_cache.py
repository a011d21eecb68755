"""Semantic cache: answer quality on the labeled question stream, GPTCache side
by side, and lookup latency at 10k / 100k / 1M entries.

Quality (benchmarks/semantic_eval.py has the protocol): precision, recall and
false-hit rate (false hits / served hits) against the fixed threshold, with
and without the lexical vetoes, and the learned thresholds at error bounds
0.01 and 0.05. `--gptcache PYTHON` also runs GPTCache (in its own venv, see
semantic_gptcache_runner.py) on the same stream with the same embeddings.

Latency (benchmarks/semantic_latency.py): the product's lookup at N synthetic
entries, 3 rounds of 2000 lookups, wall and thread-CPU p50 / p99;
`--index-dir DIR` keeps each size's HNSW graph on disk so 1M is built once.
`--ann-compare` also times faiss-cpu's HNSW (same M and efSearch), with
recall@1 against brute force.

    python benchmarks/bench_semantic_cache.py [--gptcache /tmp/gptcache-venv/bin/python]
        [--sizes 10000,100000,1000000] [--index-dir DIR] [--ann-compare] [--out DIR]
        [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import semantic_eval as se
import semantic_latency
from common import add_common_args, machine, prepare_out, write_result

from hybridkv.semantic import heldout2_pairs, heldout3_pairs, heldout_pairs, labeled_pairs
from hybridkv.semantic.cache import SemanticCache
from hybridkv.semantic.embedding import load_embedder
from hybridkv.semantic.memory_store import MemoryStore
from hybridkv.semantic.thresholds import ThresholdPolicy

HERE = os.path.dirname(os.path.abspath(__file__))
THRESHOLDS = (0.8, 0.85, 0.875, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99, 0.995)
DEFAULT_THRESHOLD = 0.9


QUESTION_SETS = {"generated": labeled_pairs.questions, "heldout": heldout_pairs.questions,
                 "heldout2": heldout2_pairs.questions, "heldout3": heldout3_pairs.questions}


def make_streams(name: str, families: int, seeds: list[int]) -> list[list]:
    """One shuffled stream of the question set `name` per seed."""
    return [se.stream(QUESTION_SETS[name](s, families), s) for s in seeds]


def quality(embedder, streams: list[list]) -> dict:
    """Fixed thresholds (vetoes on/off) and learned ones, summed over the streams."""
    rows: dict[str, list] = {"fixed_with_vetoes": [], "fixed_without_vetoes": [], "learned": []}
    tables = [_table(embedder, qs) for qs in streams]
    for guards, name in ((True, "fixed_with_vetoes"), (False, "fixed_without_vetoes")):
        for t in THRESHOLDS:
            outs = [se.run(qs, tb, threshold=t, guards=guards) for qs, tb in zip(streams, tables)]
            rows[name].append({"threshold": t, **_sum(outs).row()})
    for bound in (0.01, 0.05):
        outs = [se.run(qs, tb, threshold=DEFAULT_THRESHOLD, error_bound=bound, seed=i)
                for i, (qs, tb) in enumerate(zip(streams, tables))]
        rows["learned"].append({"error_bound": bound, **_sum(outs).row()})
    kinds, examples = _by_kind(streams, tables)
    return {"questions": sum(len(q) for q in streams), **rows, "default_by_kind": kinds,
            "default_false_hits": examples}


def _table(embedder, qs) -> se.TableEmbedder:
    texts = sorted({q.text for q in qs})
    return se.TableEmbedder(texts, embedder.embed(texts), embedder.name)


def _sum(outs: list[se.Outcome]) -> se.Outcome:
    total = se.Outcome()
    for o in outs:
        for f in ("served", "false_hits", "reachable", "right", "verified", "questions"):
            setattr(total, f, getattr(total, f) + getattr(o, f))
    return total


def _by_kind(streams, tables) -> tuple[dict, list]:
    """At the default settings: how often each kind of question was served, and
    the false hits as (question, the entry's question) pairs."""
    counts: dict[str, list[int]] = {}
    examples = []
    for qs, table in zip(streams, tables):
        cache = SemanticCache(MemoryStore(table.dim, max_entries=10**7, ttl_seconds=1e9), table,
                              ThresholdPolicy(DEFAULT_THRESHOLD))
        for q in qs:
            found = cache.lookup("s", q.text)
            row = counts.setdefault(q.kind, [0, 0, 0])
            row[0] += 1
            if found.action == "serve":
                row[1] += 1
                row[2] += found.entry.answer != q.label
                if found.entry.answer != q.label:
                    examples.append([q.kind, q.text, found.entry.text])
            else:
                cache.insert(found, q.label, "stop", 1)
    kinds = {k: {"questions": v[0], "served": v[1], "false_hits": v[2]}
             for k, v in counts.items()}
    return kinds, examples


def gptcache(python: str, embedder, streams: list[list]) -> list:
    """GPTCache's rows (summed over the streams) from its own interpreter."""
    per_seed = []
    for qs in streams:
        texts = sorted({q.text for q in qs})
        with tempfile.TemporaryDirectory() as src:
            with open(os.path.join(src, "stream.json"), "w") as f:
                json.dump([[q.text, q.label] for q in qs], f)
            with open(os.path.join(src, "texts.json"), "w") as f:
                json.dump(texts, f)
            np.save(os.path.join(src, "vectors.npy"), embedder.embed(texts))
            out = os.path.join(src, "out.json")
            subprocess.run([python, os.path.join(HERE, "semantic_gptcache_runner.py"), src, out],
                           check=True, timeout=3600, capture_output=True, cwd=src)
            with open(out) as f:
                per_seed.append(json.load(f))
    return [_sum_gpt([rows[i] for rows in per_seed]) for i in range(len(per_seed[0]))]


def _sum_gpt(rows: list[dict]) -> dict:
    total = {k: sum(r[k] for r in rows) for k in ("served", "false_hits", "right",
                                                   "reachable", "questions")}
    right = total["right"]
    return {"threshold": rows[0]["threshold"], "cosine_equivalent": rows[0]["cosine_equivalent"],
            **total, "false_hit_rate": round(total["false_hits"] / max(1, total["served"]), 4),
            "recall": round(right / max(1, total["reachable"]), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--families", type=int, default=60, help="instances of each family")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--set", default="generated", choices=sorted(QUESTION_SETS),
                    help="generated: the set the vetoes were developed on; heldout: "
                         "families and templates they were first judged on, then "
                         "developed on; heldout2, heldout3: sets written and frozen "
                         "before the vetoes were first run on them")
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--lookups", type=int, default=2000)
    ap.add_argument("--gptcache", default=None, metavar="PYTHON",
                    help="interpreter of a venv with gptcache, faiss-cpu, sqlalchemy")
    ap.add_argument("--ann-compare", action="store_true")
    ap.add_argument("--index-dir", default=None, metavar="DIR",
                    help="keep each size's HNSW graph here and reuse it (build once)")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-quality", action="store_true")
    args = ap.parse_args()
    out_dir = prepare_out(args.out)
    if args.quick:
        args.families, args.seeds, args.sizes, args.lookups = 5, "0", "2000", 200
    embedder = load_embedder(None)
    seeds = [int(s) for s in args.seeds.split(",")]
    result: dict = {"machine": machine(), "embedder": embedder.name,
                    "load_average": os.getloadavg(), "set": args.set, "seeds": seeds,
                    "families": args.families}
    if not args.skip_quality:
        streams = make_streams(args.set, args.families, seeds)
        result["quality"] = quality(embedder, streams)
        print(json.dumps(result["quality"]["fixed_with_vetoes"], indent=0), flush=True)
        if args.gptcache:
            result["gptcache"] = gptcache(args.gptcache, embedder, streams)
    if not args.skip_latency:
        sizes = [int(s) for s in args.sizes.split(",")]
        result["latency"] = semantic_latency.latency(embedder, sizes, args.lookups, 3,
                                                     args.ann_compare, args.index_dir)
    name = "bench_semantic_cache_" + ("latency" if args.skip_quality else args.set)
    print(write_result(name, result, out_dir))


if __name__ == "__main__":
    sys.exit(main())
