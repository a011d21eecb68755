"""hybridkv and vLLM 0.32 on the shared workload folder's runner, same sitting.

Alternates, round by round, the folder's own runner for hybridkv
(`DIR/hybridkv_bench.py --parts ...`, under this Python) and the same trace
and driver with vLLM's KVCacheManager (`vllm_shared_runner.py`, under
`--vllm-python`), each a fresh process; which side goes first swaps every
round. Each invocation reports the median of its own 3 replays, as the
folder's runner does. Reported per config: the median requests/s of each
side over the rounds and their range, the ratio of the medians and the
per-round ratios, hit rates, leaks, and in how many rounds hybridkv reached
`--target`x vLLM on every config at once. Writes DIR/vs_vllm_shared.json.

    python benchmarks/bench_vs_vllm_shared.py --shared-bench ../shared/bench \\
        --vllm-python VENV/bin/python [--rounds 5] [--out DIR]

(The vLLM environment: see `bench_vs_vllm.py`.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from bench_vs_vllm import VLLM_ENV, check_vllm, run_json
from common import add_common_args, prepare_out, shared_bench_dir, write_result

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "vllm_shared_runner.py")
CONFIGS = ("full", "swa", "mamba")


def run_side(cmd: list[str]) -> dict:
    """One invocation; its JSON line plus the load average around it."""
    return run_json(cmd, "JSON: ", f"bench_vs_vllm_shared: {' '.join(cmd)}")


def run_rounds(args, vllm_python: str, configs: list[str]) -> list[dict]:
    parts = ",".join(configs)
    ours = [sys.executable, os.path.join(args.shared_bench, "hybridkv_bench.py"),
            "--parts", parts, "--num-requests", str(args.num_requests)]
    theirs = [vllm_python, RUNNER, "--shared-bench", args.shared_bench, "--parts", parts,
              "--num-requests", str(args.num_requests)]
    rounds = []
    for r in range(args.rounds):
        order = [("hybridkv", ours), ("vllm", theirs)]
        if r % 2:
            order.reverse()
        result = {}
        for side, cmd in order:
            result[side] = run_side(cmd)
            rates = "  ".join(f"{c} {result[side][c]['requests_per_s']:,.0f}" for c in configs)
            print(f"round {r + 1}/{args.rounds} {side:8s} {rates}  load "
                  f"{result[side]['load_avg_1min']}", flush=True)
        if result["hybridkv"]["fingerprint"] != result["vllm"]["fingerprint"]:
            raise SystemExit("bench_vs_vllm_shared: the two sides replayed different traces")
        rounds.append(result)
    return rounds


def summarize(rounds: list[dict], configs: list[str], target: float) -> dict:
    summary: dict = {}
    for c in configs:
        ours = [r["hybridkv"][c]["requests_per_s"] for r in rounds]
        theirs = [r["vllm"][c]["requests_per_s"] for r in rounds]
        per_round = [a / b for a, b in zip(ours, theirs)]
        summary[c] = {
            "hybridkv": {"median": statistics.median(ours), "min": min(ours), "max": max(ours)},
            "vllm": {"median": statistics.median(theirs), "min": min(theirs),
                     "max": max(theirs)},
            "ratio_of_medians": round(statistics.median(ours) / statistics.median(theirs), 3),
            "ratio_per_round": [round(x, 3) for x in per_round],
            "hit_rate": [rounds[0]["hybridkv"][c]["hit_rate"], rounds[0]["vllm"][c]["hit_rate"]],
            "leak_free": all(r[s][c]["leak_free"] for r in rounds for s in ("hybridkv", "vllm")),
        }
    summary["rounds_at_target_on_every_config"] = sum(
        all(r["hybridkv"][c]["requests_per_s"] >= target * r["vllm"][c]["requests_per_s"]
            for c in configs) for r in rounds)
    return summary


def markdown(summary: dict, configs: list[str], rounds: int, target: float) -> str:
    lines = ["| config | hybridkv requests/s, median (range) | vLLM | ratio of medians | "
             "per round | hit rate hybridkv / vLLM | leaked |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in configs:
        s = summary[c]
        ours, theirs = s["hybridkv"], s["vllm"]
        lines.append(
            f"| {c} | {ours['median']:,.0f} ({ours['min']:,.0f}-{ours['max']:,.0f}) | "
            f"{theirs['median']:,.0f} ({theirs['min']:,.0f}-{theirs['max']:,.0f}) | "
            f"{s['ratio_of_medians']:.2f}x | "
            f"{', '.join(f'{x:.2f}' for x in s['ratio_per_round'])} | "
            f"{s['hit_rate'][0]} / {s['hit_rate'][1]} | {'none' if s['leak_free'] else 'yes'} |")
    lines.append(f"\n{summary['rounds_at_target_on_every_config']} of {rounds} rounds reached "
                 f"{target:g}x vLLM on every config at once.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared-bench", required=True, metavar="DIR")
    ap.add_argument("--vllm-python", default=os.environ.get(VLLM_ENV))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--target", type=float, default=5.0)
    add_common_args(ap)
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    if not configs or any(c not in CONFIGS for c in configs):
        raise SystemExit(f"--configs {args.configs!r}: use some of {', '.join(CONFIGS)}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    args.shared_bench = shared_bench_dir(args.shared_bench)
    if not os.path.isfile(os.path.join(args.shared_bench, "hybridkv_bench.py")):
        raise SystemExit(f"--shared-bench {args.shared_bench}: no hybridkv_bench.py there")
    version = check_vllm(args.vllm_python)
    prepare_out(args.out)
    if args.quick:
        args.rounds, args.num_requests = 1, 100
    rounds = run_rounds(args, args.vllm_python, configs)
    summary = summarize(rounds, configs, args.target)
    print(markdown(summary, configs, len(rounds), args.target))
    path = write_result("vs_vllm_shared", {
        "command": " ".join(["python", "benchmarks/bench_vs_vllm_shared.py"] + (argv or
                                                                               sys.argv[1:])),
        "vllm": version, "rounds": rounds, "summary": summary}, args.out)
    print(f"wrote {path}")
    return summary


if __name__ == "__main__":
    main()
