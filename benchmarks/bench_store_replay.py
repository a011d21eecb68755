"""The scheduler-path replay (2,000 requests) with and without a KV store attached.

The trace and driver of `bench_replay.py` (`shared_prefix_trace`: a 1,024-token
shared prefix + 256 unique tokens + 64 decode steps per request, 4,096 blocks
of 16 tokens, 64 running, 8,192 tokens per step) through the plain adapter
and through the same adapter with a `KVTier` over a `cpu://` store of 4x the
pool, consulted at every admission and writing what the pool evicts (every
request's unique blocks, once they are evicted) from its background thread.
Runs alternate, and which goes first alternates, so both see the same machine;
medians of `--repeats`. Requests/s are also given per CPU second (the replay
thread's plus the writer thread's), which other load on a shared machine
inflates far less than wall-clock time.

    python benchmarks/bench_store_replay.py [--out DIR] [--repeats 6] [--quick]

Writes DIR/store_replay.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_store_pressure import TieredAdapter
from common import add_common_args, prepare_out, write_result

from hybridkv.testing.replay import make_config, replay
from hybridkv.tools.bench_traces import shared_prefix_trace

NUM_BLOCKS = 4096


def run(config: str, trace, store: bool) -> dict:
    adapter = TieredAdapter(make_config(config, NUM_BLOCKS), 4 * NUM_BLOCKS if store else 0,
                            "hybrid", flush_each_lookup=False)
    c0 = time.thread_time()
    res = replay(trace.requests, adapter, max_running=64, max_batched_tokens=8192, timed=True)
    main_cpu = time.thread_time() - c0
    out = {"requests_per_s": res.requests_per_s, "hit_rate": round(res.hit_rate, 5),
           "main_cpu_s": main_cpu, "writer_cpu_s": 0.0, "written_blocks": 0,
           "leak_free": adapter.num_free_blocks == NUM_BLOCKS - 1}
    if adapter.tier is not None:
        adapter.tier.close()  # writes what is queued: counted in the writer's CPU time
        out.update(written_blocks=adapter.tier.stats().written_blocks,
                   writer_cpu_s=adapter.tier.writer.cpu_seconds)
    out["requests_per_cpu_s"] = len(trace.requests) / (out["main_cpu_s"] + out["writer_cpu_s"])
    return out


def summarize(runs: list[dict]) -> dict:
    return {"requests_per_s": statistics.median(r["requests_per_s"] for r in runs),
            "requests_per_cpu_s": statistics.median(r["requests_per_cpu_s"] for r in runs),
            "writer_cpu_s": statistics.median(r["writer_cpu_s"] for r in runs),
            "runs": [round(r["requests_per_s"], 1) for r in runs],
            "cpu_runs": [round(r["requests_per_cpu_s"], 1) for r in runs],
            "written_blocks": runs[0]["written_blocks"], "hit_rate": runs[0]["hit_rate"],
            "leak_free": all(r["leak_free"] for r in runs)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--num-requests", type=int, default=2000)
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    trace = shared_prefix_trace(num_requests=200 if args.quick else args.num_requests)
    repeats = 2 if args.quick else args.repeats
    result: dict = {"args": vars(args), "trace": trace.summary()}
    for config in args.configs.split(","):
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for i in range(repeats):
            for store in ((False, True) if i % 2 == 0 else (True, False)):
                runs[store].append(run(config, trace, store))
        row = {"without": summarize(runs[False]), "with_store": summarize(runs[True])}
        row["ratio"] = row["with_store"]["requests_per_s"] / row["without"]["requests_per_s"]
        row["cpu_ratio"] = (row["with_store"]["requests_per_cpu_s"]
                            / row["without"]["requests_per_cpu_s"])
        result[config] = row
        print(config, f"requests/s without {row['without']['requests_per_s']:.0f} with "
              f"{row['with_store']['requests_per_s']:.0f} (ratio {row['ratio']:.3f}); per CPU s "
              f"{row['without']['requests_per_cpu_s']:.0f} vs "
              f"{row['with_store']['requests_per_cpu_s']:.0f} (ratio {row['cpu_ratio']:.3f}); "
              f"{row['with_store']['written_blocks']} blocks written", flush=True)
    print("wrote", write_result("store_replay", result, args.out))
    return result


if __name__ == "__main__":
    main()
