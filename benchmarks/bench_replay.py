"""Scheduler-path replay: requests/s of the KV cache manager on full, swa and mamba configs.

The trace (`hybridkv.tools.bench_traces.shared_prefix_trace`): 2,000 requests,
each a 1,024-token shared prefix + 256 unique tokens, then 64 decode steps;
a pool of 4,096 blocks of 16 tokens, window 1,024, 64 requests running at
once, 8,192 tokens per step, sha256. The continuous-batching driver
(`hybridkv.testing.replay`) times every manager call; each config is run
`--repeats` times and the median run is reported. Writes DIR/replay.json.

    python benchmarks/bench_replay.py [--configs full,swa,mamba] [--repeats 3] [--out DIR]
    python benchmarks/bench_replay.py --quick                  # 200 requests, one run
    python benchmarks/bench_replay.py --shared-bench ../shared/bench

`--shared-bench DIR` instead runs the shared workload's own runner
(`DIR/hybridkv_bench.py`, the trace and driver the published vLLM figures
were measured with), as a cross-check against those figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings

from common import add_common_args, prepare_out, shared_bench_dir, write_result

from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.testing.replay import CONFIG_GROUPS, ManagerAdapter, make_config, replay
from hybridkv.tools.bench_traces import shared_prefix_trace

NUM_BLOCKS = 4096


def run_config(config: str, trace, repeats: int) -> dict:
    """Median (by requests/s) of `repeats` replays on a fresh manager each."""
    runs = []
    for _ in range(repeats):
        adapter = ManagerAdapter(KVCacheManager(make_config(config, NUM_BLOCKS)))
        res = replay(trace.requests, adapter, max_running=64, max_batched_tokens=8192,
                     timed=True)
        row = res.as_dict()
        row["leak_free"] = adapter.num_free_blocks == NUM_BLOCKS - 1
        runs.append(row)
    runs.sort(key=lambda r: r["requests_per_s"])
    median = runs[len(runs) // 2]
    median["all_requests_per_s"] = [r["requests_per_s"] for r in runs]
    return median


def run_own(args) -> dict:
    num_requests = 200 if args.quick else args.num_requests
    repeats = 1 if args.quick else args.repeats
    trace = shared_prefix_trace(num_requests=num_requests)
    result = {"trace": trace.summary(), "repeats": repeats}
    for config in args.configs.split(","):
        if config not in CONFIG_GROUPS:
            raise SystemExit(f"--configs: {config!r} is unknown; use {', '.join(CONFIG_GROUPS)}")
        row = run_config(config, trace, repeats)
        result[config] = row
        print(f"{config:6s} req/s {row['requests_per_s']:9.1f} (runs {row['all_requests_per_s']})"
              f"  hit {row['hit_rate']:.4f}  lookup {row['lookup_mean_us']:.1f} us"
              f"  free {row['free_mean_us']:.1f} us  leak-free {row['leak_free']}", flush=True)
    return result


def run_shared(args) -> dict:
    runner = os.path.join(shared_bench_dir(args.shared_bench), "hybridkv_bench.py")
    repeats = 1 if args.quick else args.repeats
    cmd = [sys.executable, runner, "--parts", args.configs, "--repeats", str(repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if not line.startswith("JSON: "):
            print(line)
    return {"shared_bench": json.loads(out.split("JSON: ", 1)[1])}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--shared-bench", default=None, metavar="DIR",
                    help="run the shared workload's runner in DIR instead (cross-check)")
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    warnings.simplefilter("ignore", RuntimeWarning)  # no prefix misses repeat here
    result = run_shared(args) if args.shared_bench else run_own(args)
    name = "replay_shared" if args.shared_bench else "replay"
    print("wrote", write_result(name, {"replay": result, "args": vars(args)}, args.out))
    return result


if __name__ == "__main__":
    main()
