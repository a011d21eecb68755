"""The scheduler-path replay (../shared/bench, 2,000 requests) with and without a KV store.

The shared workload's trace and driver (`traces.make_shared_prefix_trace`,
`traces.replay`: 1,024-token shared prefix + 256 unique tokens + 64 decode
steps, 4,096 blocks of 16 tokens, 64 running) through the shared adapter
(`hybridkv_bench.HybridkvEngine`) and through the same adapter with a
`KVTier` over a `cpu://` store of 4x the pool (consulted at every admission,
writing what the pool evicts in the background). Runs alternate (and which
goes first alternates), so both see the same machine; medians of `--repeats`.
Requests/s are also given per CPU second (the replay thread's plus the
writer thread's), which other load on a shared machine inflates far less.

    python benchmarks/bench_store_replay.py --out /tmp/store-bench [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench_store_pressure import TieredEngine
from common import shared_bench_dir, write_result

sys.path.insert(0, shared_bench_dir())
import hybridkv_bench as hb  # noqa: E402
import traces  # noqa: E402


def run(kind: str, config: str, trace, args, store: bool) -> dict:
    cfg = hb.make_config(config, args.num_blocks, args.window)
    eng = TieredEngine(cfg, args, 4 * args.num_blocks if store else 0, "hybrid",
                       flush_each_step=False)
    c0 = time.thread_time()
    res = traces.replay(trace, eng, max_running=args.max_running,
                        max_batched_tokens=args.max_batched_tokens)
    cpu = time.thread_time() - c0
    d = res.as_dict()
    out = {"requests_per_s": d["requests_per_s"], "hit_rate": d["hit_rate"],
           "lookup_mean_us": d["lookup_mean_us"], "main_cpu_s": cpu, "writer_cpu_s": 0.0,
           "leak_free": eng.num_free_blocks() == args.num_blocks - 1}
    if eng.tier is not None:
        eng.tier.close()  # (writes what is queued: counted in the writer's CPU time)
        stats = eng.tier.stats()
        out.update(store_lookups=stats.lookups, written_blocks=stats.written_blocks,
                   writer_cpu_s=eng.tier.writer.cpu_seconds)
    out["cpu_s"] = out["main_cpu_s"] + out["writer_cpu_s"]
    out["requests_per_cpu_s"] = len(trace.requests) / out["cpu_s"]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="full,swa,mamba")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--num-blocks", type=int, default=4096)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--max-batched-tokens", type=int, default=8192)
    ap.add_argument("--hash-algo", default="sha256")
    ap.add_argument("--eviction-policy", default="hybrid")
    ap.add_argument("--out", default="hybridkv-bench-output")
    args = ap.parse_args(argv)
    trace = traces.make_shared_prefix_trace(num_requests=args.num_requests)
    result = {"args": vars(args), "fingerprint": trace.fingerprint}
    for config in args.parts.split(","):
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for i in range(args.repeats):  # alternate which goes first
            for store in ((False, True) if i % 2 == 0 else (True, False)):
                runs[store].append(run("replay", config, trace, args, store))
        row = {}
        for store, name in ((False, "without"), (True, "with_store")):
            rates = [r["requests_per_s"] for r in runs[store]]
            cpu_rates = [r["requests_per_cpu_s"] for r in runs[store]]
            row[name] = {"requests_per_s": statistics.median(rates), "runs": rates,
                         "requests_per_cpu_s": statistics.median(cpu_rates),
                         "cpu_runs": cpu_rates,
                         "writer_cpu_s": statistics.median(r["writer_cpu_s"] for r in runs[store]),
                         "written_blocks": runs[store][0].get("written_blocks", 0),
                         "hit_rate": runs[store][0]["hit_rate"],
                         "leak_free": all(r["leak_free"] for r in runs[store])}
        row["ratio"] = row["with_store"]["requests_per_s"] / row["without"]["requests_per_s"]
        row["cpu_ratio"] = (row["with_store"]["requests_per_cpu_s"]
                            / row["without"]["requests_per_cpu_s"])
        result[config] = row
        print(config, {k: (v if not isinstance(v, dict) else
                           {kk: vv for kk, vv in v.items() if not kk.endswith("runs")})
                       for k, v in row.items()}, flush=True)
    os.makedirs(args.out, exist_ok=True)
    print("wrote", write_result("store_replay", result, os.path.join(args.out,
                                                                     "store_replay.json")))
    return result


if __name__ == "__main__":
    main()
