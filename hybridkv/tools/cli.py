"""The `hybridkv` command line: demo, simulate, bench.

Errors in the arguments print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise SystemExit(_fail(self.prog, message))


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hybridkv", description="prefix caching for hybrid LLMs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = sub.add_parser("demo", help="run the presets over three workloads, write plots")
    demo.add_argument("--out", default="hybridkv-demo-output", help="folder for the PNG plots")
    demo.add_argument("--presets", default="gemma3-tiny,jamba-tiny")
    demo.add_argument("--no-progress", action="store_true")
    sim = sub.add_parser("simulate", help="capacity planning: replay a trace through the manager")
    sim.add_argument("--model",
                     help="a known model (gemma-3-27b, gpt-oss-120b, jamba-1.5-mini, "
                          "llama-4-scout) or a config.json path (required without --instances)")
    sim.add_argument("--memory", help="KV cache budget, e.g. 40GiB, 512MiB (required "
                                      "without --instances)")
    sim.add_argument("--trace", default="shared-documents",
                     help="a JSONL file of prompts or a built-in trace "
                          "(shared-documents, few-shot, multi-turn)")
    sim.add_argument("--block-size", type=int, default=16)
    sim.add_argument("--sweep", default="0.25,0.5,1,2", help="budget multipliers for the plot")
    sim.add_argument("--out", default="hybridkv-simulate-output")
    sim.add_argument("--eviction-policy", default=None)
    add_cluster_arguments(sim)
    bench = sub.add_parser("bench", help="run a benchmark script from benchmarks/")
    bench.add_argument("name", help="hashing, pool, lookup, replay, engine, pressure")
    bench.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def add_cluster_arguments(sim: argparse.ArgumentParser) -> None:
    """`simulate --instances N`: routing policies on a simulated cluster."""
    group = sim.add_argument_group("cluster (with --instances)")
    group.add_argument("--instances", type=int, default=None,
                       help="simulate a cluster of N instances behind the router")
    group.add_argument("--router", default="all",
                       help="routing policies, comma separated, or 'all'")
    group.add_argument("--config", default="swa", help="full, swa or mamba (block 16, "
                                                       "window 1024)")
    group.add_argument("--rate", type=float, default=0.05,
                       help="open-loop requests per second per instance")
    group.add_argument("--requests", type=int, default=40,
                       help="open-loop requests per instance (chat turns come on top)")
    group.add_argument("--blocks", type=int, default=1000,
                       help="KV blocks per group per instance")
    group.add_argument("--balance", type=float, default=0.5,
                       help="hybrid-prefix: weight of queued tokens against reusable ones")
    group.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hybridkv` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from hybridkv.tools.demo import run_demo

            presets = tuple(p for p in args.presets.split(",") if p)
            return run_demo(args.out, presets, show_progress=not args.no_progress)
        if args.command == "simulate":
            from hybridkv.tools.simulate import run_simulate

            return run_simulate(args)
        from hybridkv.tools.bench import run_bench

        return run_bench(args.name, args.args)
    except (ValueError, FileNotFoundError) as e:
        return _fail(f"hybridkv {args.command}", str(e).splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
