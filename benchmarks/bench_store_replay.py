"""The scheduler-path replay (2,000 requests) with and without a KV store attached.

The trace and driver of `bench_replay.py` (`shared_prefix_trace`: a 1,024-token
shared prefix + 256 unique tokens + 64 decode steps per request, 4,096 blocks
of 16 tokens, 64 running, 8,192 tokens per step) through the plain adapter
and through the same adapter with a `KVTier` over a `cpu://` store of 4x the
pool, consulted at every admission and writing what the pool evicts (every
request's unique blocks, once they are evicted). Runs alternate, and which
goes first alternates, so both see the same machine; medians of `--repeats`
and the range. Requests/s are also given per CPU second (the replay thread's
plus the writer thread's), which other load on a shared machine inflates far
less than wall-clock time, and as the extra time per written block.

The simulated pages hold 64 bytes per block, so a step's evicted blocks come
to a few KiB and the cpu store takes them inline (`--inline-bytes`, the
tier's default); `--inline-bytes 0` sends every batch through the writer
thread, as blocks of a real model's size go.

    python benchmarks/bench_store_replay.py [--out DIR] [--repeats 6] [--quick]
        [--inline-bytes N]

Writes DIR/store_replay.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_store_pressure import TieredAdapter
from common import add_common_args, prepare_out, write_result

from hybridkv.store.codec import codec_backend
from hybridkv.store.writer import DEFAULT_INLINE_BYTES
from hybridkv.tools.bench_traces import shared_prefix_trace
from hybridkv.tools.replay import make_config, replay

NUM_BLOCKS = 4096


def run(config: str, trace, store: bool, inline_bytes: int = DEFAULT_INLINE_BYTES) -> dict:
    adapter = TieredAdapter(make_config(config, NUM_BLOCKS), 4 * NUM_BLOCKS if store else 0,
                            "hybrid", flush_each_lookup=False, inline_write_bytes=inline_bytes)
    c0 = time.thread_time()
    res = replay(trace.requests, adapter, max_running=64, max_batched_tokens=8192, timed=True)
    main_cpu = time.thread_time() - c0
    out = {"requests_per_s": res.requests_per_s, "wall_s": res.wall_s,
           "hit_rate": round(res.hit_rate, 5), "main_cpu_s": main_cpu, "writer_cpu_s": 0.0,
           "written_blocks": 0, "inline_blocks": 0, "dropped_blocks": 0, "store_keys": 0,
           "leak_free": adapter.num_free_blocks == NUM_BLOCKS - 1}
    if adapter.tier is not None:
        adapter.tier.close()  # writes what is queued: counted in the writer's CPU time
        stats = adapter.tier.stats()
        out.update(written_blocks=stats.written_blocks, dropped_blocks=stats.dropped_blocks,
                   inline_blocks=adapter.tier.writer.inline_blocks,
                   store_keys=stats.store.keys if stats.store else 0,
                   writer_cpu_s=adapter.tier.writer.cpu_seconds)
    out["cpu_s"] = out["main_cpu_s"] + out["writer_cpu_s"]
    out["requests_per_cpu_s"] = len(trace.requests) / out["cpu_s"]
    return out


def summarize(runs: list[dict]) -> dict:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {"requests_per_s": med("requests_per_s"),
            "requests_per_cpu_s": med("requests_per_cpu_s"), "wall_s": med("wall_s"),
            "cpu_s": med("cpu_s"), "writer_cpu_s": med("writer_cpu_s"),
            "runs": [round(r["requests_per_s"], 1) for r in runs],
            "cpu_runs": [round(r["requests_per_cpu_s"], 1) for r in runs],
            "written_blocks": runs[0]["written_blocks"], "hit_rate": runs[0]["hit_rate"],
            "inline_blocks": runs[0]["inline_blocks"],
            "dropped_blocks": max(r["dropped_blocks"] for r in runs),
            "store_keys": runs[0]["store_keys"],
            "leak_free": all(r["leak_free"] for r in runs)}


def compare(without: dict, with_store: dict) -> dict:
    """Ratios of the medians, and the extra time per written block (µs; None when
    nothing was written)."""
    blocks = with_store["written_blocks"]
    return {"ratio": with_store["requests_per_s"] / without["requests_per_s"],
            "cpu_ratio": with_store["requests_per_cpu_s"] / without["requests_per_cpu_s"],
            "us_per_block": (with_store["wall_s"] - without["wall_s"]) / blocks * 1e6
            if blocks else None,
            "cpu_us_per_block": (with_store["cpu_s"] - without["cpu_s"]) / blocks * 1e6
            if blocks else None}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--inline-bytes", type=int, default=DEFAULT_INLINE_BYTES,
                    help="evicted bytes per step the cpu store takes inline (0: all through "
                         f"the writer thread; default {DEFAULT_INLINE_BYTES})")
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    trace = shared_prefix_trace(num_requests=200 if args.quick else args.num_requests)
    repeats = 2 if args.quick else args.repeats
    result: dict = {"args": vars(args), "trace": trace.summary(), "codec": codec_backend()}
    for config in args.configs.split(","):
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for i in range(repeats):
            for store in ((False, True) if i % 2 == 0 else (True, False)):
                runs[store].append(run(config, trace, store, args.inline_bytes))
        row = {"without": summarize(runs[False]), "with_store": summarize(runs[True])}
        row.update(compare(row["without"], row["with_store"]))
        result[config] = row
        w, s = row["without"], row["with_store"]
        print(f"{config}: requests/s without {w['requests_per_s']:.0f} "
              f"({min(w['runs']):.0f}-{max(w['runs']):.0f}), with {s['requests_per_s']:.0f} "
              f"({min(s['runs']):.0f}-{max(s['runs']):.0f}): ratio {row['ratio']:.3f}; per CPU s "
              f"{w['requests_per_cpu_s']:.0f} vs {s['requests_per_cpu_s']:.0f}: ratio "
              f"{row['cpu_ratio']:.3f}; {s['written_blocks']} blocks written "
              f"({s['inline_blocks']} inline, {s['dropped_blocks']} dropped)"
              + (f", {row['us_per_block']:.2f} us/block wall, {row['cpu_us_per_block']:.2f} CPU"
                 if s["written_blocks"] else ""), flush=True)
    print("wrote", write_result("store_replay", result, args.out))
    return result


if __name__ == "__main__":
    main()
