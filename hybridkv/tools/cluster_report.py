"""`hybridkv simulate --instances N`: routing policies compared on a simulated cluster.

Runs the same workload (`cluster_workload`) through N instances once per
routing policy, and once through one instance with N times the memory and
compute (the hit rate routing can at best reach), then prints per policy the
prefix hit rate, the load imbalance (max / mean busy time), time to first
token p50 / p99, preemptions and the router's decision time, and writes
`cluster_<config>_<N>.png`.
"""

from __future__ import annotations

import math
import os
import statistics
from argparse import ArgumentParser, Namespace
from typing import TYPE_CHECKING

from hybridkv.serving.router.policy import (
    DEFAULT_BALANCE,
    POLICIES,
    check_balance,
    check_policy,
)
from hybridkv.tools.cluster_workload import ClusterWorkload, WorkloadShape

if TYPE_CHECKING:  # the simulator loads the engine (torch): only a cluster run imports it,
    # so the CLI's parser (route, bench, ...) starts without torch
    from hybridkv.tools.cluster_sim import RunResult

BIG = "one instance, N x memory"


def add_cluster_arguments(p: ArgumentParser) -> None:
    """The options of `simulate --instances N`."""
    group = p.add_argument_group("cluster of instances behind the router (--instances N)")
    group.add_argument("--instances", type=int, default=None,
                       help="simulate N instances behind the router, once per policy")
    group.add_argument("--router", default="all",
                       help=f"routing policies, comma-separated, or 'all' ({', '.join(POLICIES)})")
    group.add_argument("--config", default="swa",
                       help="full, swa (full + window 1024) or mamba (full + Mamba); block 16")
    group.add_argument("--rate", type=float, default=0.05,
                       help="open-loop requests per second per instance")
    group.add_argument("--requests", type=int, default=40,
                       help="open-loop requests per instance (chat turns come on top)")
    group.add_argument("--blocks", type=int, default=1000, help="KV blocks per group per instance")
    group.add_argument("--balance", type=float, default=DEFAULT_BALANCE,
                       help="hybrid-prefix: weight of queued tokens against reusable ones")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--mix", default="0.5,0.2,0.3",
                       help="shares of open-loop arrivals: documents, few-shot, chat sessions")


def parse_mix(text: str) -> tuple[float, float, float]:
    """'0.5,0.2,0.3' -> the workload mix (three non-negative shares, not all 0)."""
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or not all(0 <= x < math.inf for x in parts) or not sum(parts) > 0:
        raise ValueError(f"--mix {text!r}: give three shares doc,fewshot,chat like 0.5,0.2,0.3")
    return parts[0], parts[1], parts[2]


def policies_from(text: str) -> list[str]:
    """'all' or a comma list of policy names."""
    names = list(POLICIES) if text == "all" else [p for p in text.split(",") if p]
    if not names:
        raise ValueError("--router needs a policy name or 'all'")
    return [check_policy(p) for p in names]


def run_cluster(args: Namespace) -> int:
    """The `hybridkv simulate --instances N` command."""
    from hybridkv.tools.cluster_sim import CONFIGS, ClusterSim, CostModel, InstanceShape

    n = args.instances
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
        raise ValueError(f"--instances must be an int in [1, 1024], got {n!r}")
    if args.config not in CONFIGS:
        raise ValueError(f"--config {args.config!r} is unknown; use one of {', '.join(CONFIGS)}")
    policies = policies_from(args.router)
    balance = check_balance(args.balance)
    args.mix = parse_mix(args.mix) if isinstance(args.mix, str) else args.mix
    shape = InstanceShape(blocks_per_group=args.blocks,
                          eviction_policy=args.eviction_policy or "hybrid")
    cost = CostModel()
    print(f"cluster: {n} instances, config {args.config} ({_describe(args.config)}), "
          f"{args.blocks} blocks per group per instance ({shape.eviction_policy} eviction), "
          f"{args.requests} open-loop requests per instance at {args.rate:g}/s each, "
          f"mix {','.join(f'{x:g}' for x in args.mix)} (doc, few-shot, chat), seed {args.seed}")
    print(f"cost model: {cost.source}; times below are that machine's")
    results = []
    for policy in policies:
        sim = ClusterSim(args.config, _workload(args), policy, shape=shape, cost=cost,
                         balance=balance, seed=args.seed)
        results.append(sim.run())
        print(_row(results[-1]), flush=True)
    big = ClusterSim(args.config, _workload(args), "round-robin", shape=shape, cost=cost,
                     num_instances=1, scale=n, seed=args.seed).run()
    big.policy = BIG
    print(_row(big))
    for line in check_targets(results, big):
        print(line)
    path = plot(args.out, args.config, n, results + [big])
    print(f"plot: {path}")
    return 0


def _workload(args: Namespace) -> ClusterWorkload:
    return ClusterWorkload(args.instances, args.rate, args.requests, seed=args.seed,
                           shape=WorkloadShape(mix=args.mix))


def _describe(config: str) -> str:
    from hybridkv.tools.cluster_sim import CONFIGS

    return " + ".join(type(s).__name__.replace("Spec", "") for s in CONFIGS[config])


def _row(r: RunResult) -> str:
    route = statistics.median(r.route_us) if r.route_us else 0.0
    return (f"  {r.policy:24s} hit rate {r.hit_rate:.3f}  imbalance {r.imbalance:.2f}  "
            f"TTFT p50 {r.ttft(0.5):7.2f} s  p99 {r.ttft(0.99):7.2f} s "
            f"(floor {r.ttft_floor(0.99):5.1f})  "
            f"requests {len(r.records)}  preemptions {r.preemptions}  "
            f"route {route:.0f} us  ({r.wall_s:.0f} s)")


def check_targets(results: list[RunResult], big: RunResult) -> list[str]:
    """Lines saying whether hybrid-prefix meets its targets on this run."""
    by = {r.policy: r for r in results}
    hp = by.get("hybrid-prefix")
    if hp is None:
        return []
    lines = [_target(f"hit rate {hp.hit_rate:.3f} >= 0.95 x {big.hit_rate:.3f}",
                     hp.hit_rate >= 0.95 * big.hit_rate),
             _target(f"imbalance {hp.imbalance:.2f} <= 1.5", hp.imbalance <= 1.5)]
    for other in ("round-robin", "prefix"):
        if other in by:
            ratio = hp.ttft(0.99) / by[other].ttft(0.99)
            lines.append(_target(f"p99 TTFT {1 - ratio:.0%} lower than {other} (>= 20%)",
                                 ratio <= 0.8))
    return lines


def _target(text: str, met: bool) -> str:
    return f"  target {'met' if met else 'NOT met'}: {text}"


def plot(out_dir: str, config: str, n: int, results: list[RunResult]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    names = [r.policy.replace(", ", ",\n") for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    axes[0].bar(names, [r.hit_rate for r in results], color="tab:blue")
    axes[0].set(title="prefix hit rate", ylim=(0, 1))
    axes[1].bar(names, [r.imbalance for r in results], color="tab:orange")
    axes[1].axhline(1.5, color="gray", linestyle="--", linewidth=1)
    axes[1].set(title="load imbalance (max / mean busy time)")
    x = range(len(results))
    axes[2].bar([i - 0.2 for i in x], [r.ttft(0.5) for r in results], 0.4, label="p50")
    axes[2].bar([i + 0.2 for i in x], [r.ttft(0.99) for r in results], 0.4, label="p99")
    axes[2].set(title="time to first token (s, simulated)", yscale="log")
    axes[2].set_xticks(list(x), names)
    axes[2].legend()
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle(f"{n} instances, config {config}: routing policies")
    fig.tight_layout()
    path = os.path.join(out_dir, f"cluster_{config}_{n}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
