"""Scheduler-path replay: requests/s of the KV cache manager on full, swa and mamba configs.

The trace (`hybridkv.tools.bench_traces.shared_prefix_trace`): 2,000 requests,
each a 1,024-token shared prefix + 256 unique tokens, then 64 decode steps;
a pool of 4,096 blocks of 16 tokens, window 1,024, 64 requests running at
once, 8,192 tokens per step, sha256. The continuous-batching driver
(`hybridkv.tools.replay`) times every manager call; each config is run
`--repeats` times and the median run is reported, with the mean cost of
each call (start = Request(), lookup, prefill and decode allocations,
append, free). The paths that ran are recorded (`hybridkv --version`: the C
hashing and fast-path extensions, or their pure-Python fallbacks; compare
with `HYBRIDKV_DISABLE_FASTPATH=1`). Writes DIR/replay.json.

    python benchmarks/bench_replay.py [--configs full,swa,mamba] [--repeats 3] [--out DIR]
    python benchmarks/bench_replay.py --quick                  # 200 requests, one run
    python benchmarks/bench_replay.py --pool-sizes 4096,65536,1048576
    python benchmarks/bench_replay.py --shared-bench ../shared/bench

`--pool-sizes` checks that per-call costs stay flat with the pool's size:
each pool is first filled with cached blocks (unique prompts allocated and
freed until all but the trace's working set is cached), then the trace is
replayed on it (the 4,096-block default has no room to fill).

`--shared-bench DIR` instead runs the shared workload's own runner
(`DIR/hybridkv_bench.py`, the trace and driver the published vLLM figures
were measured with), as a cross-check against those figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import warnings

from common import add_common_args, prepare_out, shared_bench_dir, write_result

from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.tools.bench_traces import shared_prefix_trace
from hybridkv.tools.cli import version_text
from hybridkv.tools.replay import CONFIG_GROUPS, TIMED_CALLS, ManagerAdapter, make_config, replay

NUM_BLOCKS = 4096
WORKING_SET = 6000  # blocks the trace holds at once at most (64 requests x 84 blocks), rounded up
FILL_PROMPT = 64 * 16  # tokens of each prompt that fills a large pool


def run_config(config: str, trace, repeats: int, num_blocks: int = NUM_BLOCKS) -> dict:
    """Median (by requests/s) of `repeats` replays on a fresh manager each."""
    runs = []
    for _ in range(repeats):
        adapter = ManagerAdapter(KVCacheManager(make_config(config, num_blocks)))
        filled = fill_pool(adapter, num_blocks - WORKING_SET) if num_blocks > NUM_BLOCKS else 0
        free_before = adapter.num_free_blocks
        res = replay(trace.requests, adapter, max_running=64, max_batched_tokens=8192,
                     timed=True)
        row = res.as_dict()
        row["leak_free"] = adapter.num_free_blocks == free_before
        row["cached_before"] = filled
        runs.append(row)
    runs.sort(key=lambda r: r["requests_per_s"])
    median = runs[len(runs) // 2]
    median["all_requests_per_s"] = [r["requests_per_s"] for r in runs]
    return median


def fill_pool(adapter: ManagerAdapter, num_cached: int) -> int:
    """Cache about `num_cached` blocks of unique prompts (allocated, then freed)."""
    kv, rng, i = adapter.manager, random.Random(0), 0
    while sum(map(len, kv.pool.cached)) < num_cached:
        req = Request(f"fill-{i}", [rng.randrange(32000) for _ in range(FILL_PROMPT + 1)])
        assert kv.allocate_slots(req, FILL_PROMPT) is not None
        req.num_computed_tokens = FILL_PROMPT
        kv.free(req)
        i += 1
    return sum(map(len, kv.pool.cached))


def print_row(config: str, row: dict, label: str = "") -> None:
    calls = "  ".join(f"{c} {row[f'{c}_mean_us']:.2f}" for c in TIMED_CALLS
                      if c not in ("preempt", "new_step"))
    print(f"{config:6s}{label} req/s {row['requests_per_s']:9.1f} "
          f"(runs {row['all_requests_per_s']})  hit {row['hit_rate']:.4f}  "
          f"leak-free {row['leak_free']}\n       per call (us): {calls}", flush=True)


def run_own(args) -> dict:
    num_requests = 200 if args.quick else args.num_requests
    repeats = 1 if args.quick else args.repeats
    trace = shared_prefix_trace(num_requests=num_requests)
    result = {"trace": trace.summary(), "repeats": repeats, "paths": version_text()}
    print(result["paths"])
    for config in args.configs.split(","):
        if config not in CONFIG_GROUPS:
            raise SystemExit(f"--configs: {config!r} is unknown; use {', '.join(CONFIG_GROUPS)}")
        if args.pool_sizes:
            result[config] = {}
            for size in (int(s) for s in args.pool_sizes.split(",")):
                row = run_config(config, trace, repeats, size)
                result[config][str(size)] = row
                print_row(config, row, f" {size:>8} blocks ({row['cached_before']} cached)")
            continue
        result[config] = row = run_config(config, trace, repeats)
        print_row(config, row)
    return result


def run_shared(args) -> dict:
    runner = os.path.join(shared_bench_dir(args.shared_bench), "hybridkv_bench.py")
    repeats = 1 if args.quick else args.repeats
    cmd = [sys.executable, runner, "--parts", args.configs, "--repeats", str(repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if not line.startswith("JSON: "):
            print(line)
    return {"shared_bench": json.loads(out.split("JSON: ", 1)[1]), "paths": version_text()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--pool-sizes", default=None, metavar="N,N,...",
                    help="replay on pools of these many blocks, filled with cached blocks")
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
