"""Routing policies on simulated clusters: every config and cluster size asked for.

Runs `hybridkv simulate --instances N` (hybridkv.tools.cluster_report) for
each config (full, swa, mamba) and N, and prints one markdown table row per
policy: hit rate (and its share of one instance with N times the memory),
load imbalance, TTFT p50 / p99 (and the p99 floor: each request alone on an
idle instance with the tokens it reused, which no routing can beat) and the
router's median decision time.

    python benchmarks/bench_cluster.py                       # 8, 16, 64 x swa, mamba, full
    python benchmarks/bench_cluster.py --sizes 8,16 --configs swa --eviction-policy lru
    python benchmarks/bench_cluster.py --seed 1 --mix 0.2,0.2,0.6 --policies hybrid-prefix

Results go to `--out DIR` as cluster.json, plots beside it.
"""

from __future__ import annotations

import argparse
import statistics

from common import add_common_args, prepare_out, write_result

from hybridkv.serving.router.policy import DEFAULT_BALANCE, POLICIES
from hybridkv.tools.cluster_report import BIG, check_targets, parse_mix, plot
from hybridkv.tools.cluster_sim import ClusterSim, CostModel, InstanceShape, RunResult
from hybridkv.tools.cluster_workload import ClusterWorkload, WorkloadShape


def run(config: str, n: int, args) -> list[RunResult]:
    shape = InstanceShape(blocks_per_group=args.blocks, eviction_policy=args.eviction_policy)
    out = []
    mix = WorkloadShape(mix=parse_mix(args.mix))
    for policy in args.policies.split(","):
        workload = ClusterWorkload(n, args.rate, args.requests, seed=args.seed, shape=mix)
        out.append(ClusterSim(config, workload, policy, shape=shape, balance=args.balance,
                              seed=args.seed).run())
    workload = ClusterWorkload(n, args.rate, args.requests, seed=args.seed, shape=mix)
    big = ClusterSim(config, workload, "round-robin", shape=shape, num_instances=1, scale=n,
                     seed=args.seed).run()
    big.policy = BIG
    return out + [big]


def row(config: str, n: int, r: RunResult, big: RunResult) -> str:
    route = statistics.median(r.route_us) if r.route_us else 0.0
    return (f"| {config} | {n} | {r.policy} | {r.hit_rate:.3f} ({r.hit_rate / big.hit_rate:.0%}) "
            f"| {r.imbalance:.2f} | {r.ttft(0.5):.1f} | {r.ttft(0.99):.1f} "
            f"| {r.ttft_floor(0.99):.1f} | {r.preemptions} | {route:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,16,64")
    ap.add_argument("--configs", default="swa,mamba,full")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--balance", type=float, default=DEFAULT_BALANCE)
    ap.add_argument("--eviction-policy", default="hybrid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", default="0.5,0.2,0.3",
                    help="shares of open-loop arrivals: documents, few-shot, chat sessions")
    add_common_args(ap)
    args = ap.parse_args()
    prepare_out(args.out)
    if args.quick:
        args.sizes, args.configs, args.requests = "4", "swa", 8
    print(f"cost model: {CostModel().source}")
    print("| config | N | policy | hit rate (of 1 x N memory) | imbalance | TTFT p50 s "
          "| TTFT p99 s | p99 floor s | preemptions | route us |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    table = []
    for config in args.configs.split(","):
        for n in (int(x) for x in args.sizes.split(",")):
            results = run(config, n, args)
            big = results[-1]
            for r in results:
                print(row(config, n, r, big), flush=True)
            for line in check_targets(results[:-1], big):
                print(f"<!-- {config} N={n}: {line.strip()} -->")
            plot(args.out, config, n, results)
            table += [{"config": config, "instances": n, "policy": r.policy,
                       "hit_rate": r.hit_rate, "imbalance": r.imbalance,
                       "ttft_p50_s": r.ttft(0.5), "ttft_p99_s": r.ttft(0.99),
                       "ttft_p99_floor_s": r.ttft_floor(0.99),
                       "preemptions": r.preemptions, "requests": len(r.records),
                       "route_us_median": statistics.median(r.route_us) if r.route_us else 0}
                      for r in results]
    print("wrote", write_result("cluster", {"config": vars(args), "rows": table}, args.out))


if __name__ == "__main__":
    main()
