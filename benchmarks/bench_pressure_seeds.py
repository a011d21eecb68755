"""Hit rate under pressure over several trace seeds, per eviction policy.

The pressure workloads (`hybridkv.tools.pressure`) are fixed-seed traces; a
retention rule can look better or worse on one trace by chance (which prefix
happens to be evicted first changes everything after it). This runs the same
settings with other seeds and reports the mean per policy, so a policy change
is judged on more than the one trace of `bench_pressure.py`. Writes
DIR/pressure_seeds.json.

    python benchmarks/bench_pressure_seeds.py [--seeds 6] [--policies lru,hybrid]
        [--configs full,swa,mamba] [--settings multi_turn@40,fewshot@50,long_doc@40]
        [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from common import add_common_args, prepare_out, write_result

from hybridkv.tools.pressure import SETTINGS, run_setting


def run_row(name: str, config: str, policies: list[str], seeds: int, quick: bool) -> dict:
    """Per policy: the mean hit rate over `seeds` traces (seed k: the official seed + 100 k)."""
    base = SETTINGS[name].seed
    row: dict = {"setting": name, "config": config}
    for policy in policies:
        hits = [run_setting(name, config, policy=policy, seed=base + 100 * k,
                            quick=quick)["hit_rate"] for k in range(seeds)]
        row[policy] = {"mean": round(statistics.mean(hits), 4), "per_seed": hits}
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6, help="trace seeds: the official one + N-1")
    ap.add_argument("--policies", default="lru,hybrid")
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    add_common_args(ap)
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    prepare_out(args.out)
    seeds = 2 if args.quick else args.seeds
    policies = args.policies.split(",")
    warnings.simplefilter("ignore", RuntimeWarning)  # the repeated-miss warning is expected
    rows = []
    t0 = time.perf_counter()
    for name in args.settings.split(","):
        if name not in SETTINGS:
            ap.error(f"unknown setting {name!r}; known: {', '.join(SETTINGS)}")
        for config in args.configs.split(","):
            rows.append(run_row(name, config, policies, seeds, args.quick))
            print(f"{name:14s} {config:6s} " + "  ".join(
                f"{p} mean {rows[-1][p]['mean']:.4f} {rows[-1][p]['per_seed']}"
                for p in policies), flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    print("wrote", write_result("pressure_seeds", {"seeds": seeds, "rows": rows,
                                                   "args": vars(args)}, args.out))
    return {"rows": rows}


if __name__ == "__main__":
    main()
