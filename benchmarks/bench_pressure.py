"""Hit rate under memory pressure, per eviction policy, on the project's own workloads.

Settings (`hybridkv.tools.pressure`): round-robin multi-turn chat with a pool
of 40% of the reusable working set (`multi_turn@40`), branching few-shot
headers at 50% (`fewshot@50`) and long-document QA at 40% (`long_doc@40`),
each on the full, swa and mamba configs; prints hit rate, the infinite-pool
ceiling, requests/s, preemptions, evictions and a leak check, and writes
DIR/pressure.json. Hit rates are deterministic.

    python benchmarks/bench_pressure.py [--policies lru,hybrid] [--settings multi_turn@40]
        [--configs full,swa,mamba] [--out DIR] [--quick]
    python benchmarks/bench_pressure.py --shared-bench ../shared/bench

`--quick` uses small traces of the same shapes. `--shared-bench DIR` instead
runs the shared workload's `pressure_bench.py` (the traces and driver the
published vLLM figures were measured with, plus its clairvoyant reference) as
a cross-check against those figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

from common import add_common_args, prepare_out, shared_bench_dir, write_result

from hybridkv.tools.pressure import SETTINGS, run_setting
from hybridkv.tools.replay import CONFIG_GROUPS


def _names(text: str, known, flag: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    for n in names:
        if n not in known:
            raise SystemExit(f"{flag}: {n!r} is unknown; use {', '.join(known)}")
    return names


def run_own(args) -> list[dict]:
    rows = []
    print(f"{'setting':14s} {'config':6s} {'policy':7s} {'blocks':>6s} {'hit':>7s} "
          f"{'ceiling':>7s} {'req/s':>8s} {'preempt':>7s} {'evict':>7s} leak-free")
    for name in _names(args.settings, SETTINGS, "--settings"):
        for config in _names(args.configs, CONFIG_GROUPS, "--configs"):
            for policy in args.policies.split(","):
                r = run_setting(name, config, policy=policy, quick=args.quick)
                rows.append(r)
                print(f"{name:14s} {config:6s} {policy:7s} {r['num_blocks']:>6d} "
                      f"{r['hit_rate']:>7.4f} {r['ceiling_hit_rate']:>7.4f} "
                      f"{r['requests_per_s']:>8.1f} {r['preemptions']:>7d} "
                      f"{r['evictions']:>7d} {r['leak_free']}", flush=True)
    return rows


def run_shared(args) -> dict:
    runner = os.path.join(shared_bench_dir(args.shared_bench), "pressure_bench.py")
    result = {}
    for policy in args.policies.split(","):
        cmd = [sys.executable, runner, "--eviction-policy", policy] + ["--small"] * args.quick
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        print(f"== eviction_policy={policy}")
        for line in out.splitlines():
            if not line.startswith("JSON: "):
                print(line)
        result[policy] = json.loads(out.split("JSON: ", 1)[1])
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="lru,hybrid")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--configs", default=",".join(CONFIG_GROUPS))
    ap.add_argument("--shared-bench", default=None, metavar="DIR",
                    help="run the shared workload's pressure_bench.py in DIR instead")
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    warnings.simplefilter("ignore", RuntimeWarning)  # repeated misses are the point here
    t0 = time.perf_counter()
    if args.shared_bench:
        result = {"shared_bench": run_shared(args)}
        name = "pressure_shared"
    else:
        result = {"rows": run_own(args)}
        name = "pressure"
    print(f"({time.perf_counter() - t0:.0f} s)")
    print("wrote", write_result(name, {"pressure": result, "args": vars(args)}, args.out))
    return result


if __name__ == "__main__":
    main()
