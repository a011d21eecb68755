"""Time to first token of a shared-document request: recompute vs load from a KV store.

One document (2,048 tokens) plus a 32-token question. `recompute`: a fresh
engine computes all 2,080 tokens. Per backend (cpu, file, redis): one engine
computes the document and writes its blocks through to the store; then, for
each repeat, a fresh engine (empty pool, same store) serves the document
with a new question: it loads the document's blocks and computes only the
question. Reported per backend: TTFT, load time and bytes (the tier's own
counters), load bytes/s, and the ceiling of the same transfer measured in
the same run: a memcpy of the loaded bytes (cpu, file) and loopback Redis
SET/GET of as many values of the loaded sizes, through redis-py (pipelined SETs,
one MGET: what the store does, without checks or copies) and `redis-benchmark`
(redis).

    python benchmarks/bench_store.py --out /tmp/store-bench             # small model
    python benchmarks/bench_store.py --out /tmp/store-bench --repeats 3 \\
        --config-overrides benchmarks/configs/gemma3_1b_dims.json --kv-cache-bytes 600000000

Without `--config-overrides` the model is Gemma 3 1B's proportions at a quarter of its
width (`SMALL_DIMS`). Redis: `--redis-url`, else a redis-server started on a free
loopback port for the run. Writes DIR/store_ttft.json (`--out DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import torch
from bench_engine import build_model, make_workload
from common import add_common_args, prepare_out, write_result
from store_ceilings import memcpy_bytes_per_s, redis_bytes_per_s, start_redis

from hybridkv import LLM, SamplingParams
from hybridkv.store import CpuStore
from hybridkv.store.payload import HEADER_BYTES

SMALL_DIMS = {
    "hidden_size": 256, "intermediate_size": 1536, "num_hidden_layers": 12,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
    "query_pre_attn_scalar": 64, "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
}
ONE = SamplingParams(max_tokens=1, ignore_eos=True)


def ttft(llm: LLM, prompt: list[int]) -> tuple[float, int, int]:
    """(time to first token, cached tokens, of which from the store) of one prompt."""
    out = llm.generate([prompt], ONE)[0]
    assert out.metrics is not None
    return out.metrics.time_to_first_token, out.num_cached_tokens, out.num_external_cached_tokens


def engine(model, args, store=None, **kwargs) -> LLM:
    """An engine whose pool memory is touched and whose first step has run (a warm
    server): a 32-token prompt sharing no block with the document, untimed."""
    llm = LLM(model, block_size=args.block_size, max_num_batched_tokens=args.chunk,
              kv_cache_memory_bytes=args.kv_cache_bytes, kv_store=store, **kwargs)
    for slot in llm.executor.kv_slots:
        slot.zero_()
    llm.generate([list(range(3, 35))], ONE)
    return llm


def recompute(model, doc, questions, args) -> dict:
    runs = [ttft(engine(model, args), doc + questions[i])[0] for i in range(args.miss_repeats)]
    return {"ttft_s": statistics.median(runs), "runs": runs}


def backend_url(kind: str, args, workdir: str):
    if kind == "cpu":
        return CpuStore(4 << 30)  # one in-process store shared by writer and readers
    if kind == "file":
        return f"file://{workdir}/file-store?size=8GiB"
    return args.redis_url


def load_runs(model, doc, questions, kind: str, args, workdir: str) -> dict:
    """Write the document through to the store, then time fresh engines loading it."""
    store = backend_url(kind, args, workdir)
    writer = engine(model, args, store, kv_store_write_through=True)
    ttft(writer, doc + questions[0])
    writer.flush_kv_store()
    written = writer.kv_store_stats()
    if kind != "cpu":
        writer.close()
    runs, loads = [], []
    for i in range(args.repeats):
        reader = engine(model, args, store)  # a new pool (and, for file/redis, a new client)
        t, cached, external = ttft(reader, doc + questions[1 + i % (len(questions) - 1)])
        stats = reader.kv_store_stats()
        assert external == cached > 0, (kind, cached, external)
        runs.append(t)
        loads.append({"load_s": stats.load_seconds, "load_cpu_s": stats.load_cpu_seconds,
                      "read_bytes": stats.read_bytes, "loaded_blocks": stats.loaded_blocks,
                      "external_tokens": external, "value_sizes": value_sizes(stats)})
        if kind != "cpu":
            reader.close()
    load_s = statistics.median(x["load_s"] for x in loads)
    load_cpu_s = statistics.median(x["load_cpu_s"] for x in loads)
    return {"ttft_s": statistics.median(runs), "runs": runs, "loads": loads,
            "load_s": load_s, "load_cpu_s": load_cpu_s, "read_bytes": loads[0]["read_bytes"],
            "load_bytes_per_s": loads[0]["read_bytes"] / load_s,
            "load_bytes_per_cpu_s": loads[0]["read_bytes"] / load_cpu_s,
            "written_blocks": written.written_blocks, "written_bytes": written.written_bytes,
            "value_sizes": loads[0]["value_sizes"]}


def value_sizes(stats) -> list[tuple[int, int]]:
    """(stored value bytes, blocks) per group of what one load read."""
    return [(g.read_bytes // g.loaded_blocks + HEADER_BYTES, g.loaded_blocks)
            for g in stats.groups if g.loaded_blocks]


def ceilings(kind: str, result: dict, args) -> dict:
    if kind == "redis":
        return redis_bytes_per_s(args.redis_url, result["value_sizes"])
    return memcpy_bytes_per_s(result["read_bytes"])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gemma3-tiny")
    ap.add_argument("--config-overrides", default=None,
                    help="JSON or a file of config values (default: SMALL_DIMS)")
    ap.add_argument("--doc-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--num-requests", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--kv-cache-bytes", type=int, default=400_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--miss-repeats", type=int, default=2)
    ap.add_argument("--backends", default="cpu,file,redis")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    args.config_overrides = args.config_overrides or json.dumps(SMALL_DIMS)
    if args.quick:  # a tiny model and document: checks the script runs
        args.config_overrides = json.dumps({})
        args.doc_len, args.repeats, args.miss_repeats, args.kv_cache_bytes = 256, 1, 1, 16 << 20
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    server = None
    if "redis" in args.backends and args.redis_url is None:
        server = start_redis()
        args.redis_url = server.url
    workdir = tempfile.mkdtemp(prefix="store-bench-", dir=os.path.abspath(args.out))
    try:
        result = run(args, workdir)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print("wrote", write_result("store_ttft", result, args.out))
    return result


def run(args, workdir: str) -> dict:
    t0 = time.perf_counter()
    model = build_model(args)
    print(f"model built in {time.perf_counter() - t0:.1f} s", flush=True)
    doc, questions = make_workload(args.num_requests, args.doc_len, args.question_len,
                                   model.config.vocab_size, args.seed)
    result = {"config": {k: v for k, v in vars(args).items() if k != "redis_url"},
              "torch": torch.__version__}
    result["recompute"] = recompute(model, doc, questions, args)
    print("recompute", json.dumps(result["recompute"]), flush=True)
    miss = result["recompute"]["ttft_s"]
    for kind in args.backends.split(","):
        row = load_runs(model, doc, questions, kind, args, workdir)
        row["ceiling"] = ceilings(kind, row, args)
        row["recompute_over_ttft"] = miss / row["ttft_s"]
        row["recompute_over_load"] = miss / row["load_s"]
        result[kind] = row
        print(kind, json.dumps({k: v for k, v in row.items() if k != "loads"}), flush=True)
    return result


if __name__ == "__main__":
    main()
