"""The `hybridkv` command line: demo, simulate, bench, serve, and `--version`.

Each subcommand is one entry of `COMMANDS`: its help line, a function adding
its arguments and a function running it (returns the exit code). Adding a
subcommand is adding an entry. Errors in the arguments, and bad values found
while running (ValueError, FileNotFoundError), print one line and exit with
status 2.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise SystemExit(_fail(self.prog, message))


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def version_text() -> str:
    """`hybridkv --version`: the version, the hashing path, the KV cache fast path and
    the decode attention path."""
    from hybridkv import __version__
    from hybridkv.kernels import decode_native
    from hybridkv.kv_cache.fastpath import fastpath_backend
    from hybridkv.kv_cache.hashing import hashing_backend

    return (f"hybridkv {__version__}\nblock hashing: {hashing_backend().describe()}\n"
            f"KV cache fast path: {fastpath_backend().describe()}\n"
            f"decode attention: {decode_native.describe()}")


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version, the "
                         "hashing path and the KV cache fast path (C extensions or pure-Python "
                         "fallbacks), then exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit()


def check_output_dir(path: str, flag: str = "--out") -> str:
    """Check, before any work, that a file can be written in `path` (created if missing).

    Folders the check had to create are removed again, so that a run that
    then fails on another argument leaves nothing behind. Raises ValueError
    naming the flag and the path (a path under a file, a read-only or
    virtual file system, ...).
    """
    created = []
    head = os.path.abspath(path)
    while not os.path.exists(head):
        created.append(head)
        head = os.path.dirname(head)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write there ({e.strerror or e})") from e
    finally:
        for folder in created:  # deepest first
            if os.path.isdir(folder):
                os.rmdir(folder)
    return path


# ---- demo -------------------------------------------------------------------

def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="hybridkv-demo-output", help="folder for the PNG plots")
    p.add_argument("--presets", default="gemma3-tiny,jamba-tiny")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed runs per figure after a warm-up run (median reported)")
    p.add_argument("--threads", type=int, default=1, help="torch threads while measuring")
    p.add_argument("--no-progress", action="store_true")


def _run_demo(args: argparse.Namespace) -> int:
    check_output_dir(args.out)
    from hybridkv.tools.demo import run_demo

    presets = tuple(p for p in args.presets.split(",") if p)
    return run_demo(args.out, presets, show_progress=not args.no_progress,
                    repeats=args.repeats, num_threads=args.threads)


# ---- simulate ---------------------------------------------------------------

def _simulate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model",
                   help="a known model (gemma-3-27b, gpt-oss-120b, jamba-1.5-mini, "
                        "llama-4-scout) or a config.json path (required without --instances)")
    p.add_argument("--memory",
                   help="KV cache budget: decimal SI units (40GB = 40*10^9 bytes, MB, kB, TB) "
                        "or binary units (40GiB = 40*2^30 bytes, MiB, KiB, TiB) (required "
                        "without --instances)")
    p.add_argument("--trace", default="shared-documents",
                   help="a JSONL file of prompts or a built-in trace "
                        "(shared-documents, few-shot, multi-turn)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--sweep", default="0.25,0.5,1,2",
                   help="budget multipliers for the plot, comma-separated positive numbers")
    p.add_argument("--out", default="hybridkv-simulate-output", help="folder for the plot")
    p.add_argument("--eviction-policy", default=None)
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="requests in flight at once; the rest wait, admitted in trace order as "
                        "others finish (a server driven by N concurrent clients: N)")
    p.add_argument("--passes", type=int, default=1,
                   help="replay the trace this many times in a row (one queue)")
    from hybridkv.tools.cluster_report import add_cluster_arguments

    add_cluster_arguments(p)


def _run_simulate(args: argparse.Namespace) -> int:
    if args.instances is not None:  # a cluster behind the router
        from hybridkv.tools.cluster_report import run_cluster

        check_output_dir(args.out)
        return run_cluster(args)
    from hybridkv.kv_cache.checks import check_int, parse_bytes
    from hybridkv.tools.simulate import parse_sweep, run_simulate

    if not args.model or not args.memory:
        raise ValueError("the following arguments are required: --model, --memory "
                         "(or --instances N for a cluster)")
    parse_bytes(args.memory)  # bad values fail before any work
    parse_sweep(args.sweep)
    check_int("--max-num-seqs", args.max_num_seqs, 1)
    check_int("--passes", args.passes, 1)
    check_output_dir(args.out)
    return run_simulate(args)


# ---- bench ------------------------------------------------------------------

def _bench_args(p: argparse.ArgumentParser) -> None:
    from hybridkv.tools.bench import SCRIPTS

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = "benchmarks:\n" + "\n".join(f"  {name:15s} {script.summary}"
                                            for name, script in SCRIPTS.items())
    p.add_argument("name", metavar="NAME", help="the benchmark to run (listed below)")
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="the script's own arguments (NAME --help lists them); every script "
                        "takes --out DIR (default ./hybridkv-bench-output) and --quick")


def _run_bench(args: argparse.Namespace) -> int:
    from hybridkv.tools.bench import run_bench

    return run_bench(args.name, args.args)


# ---- serve ------------------------------------------------------------------

def _serve_args(p: argparse.ArgumentParser) -> None:
    from hybridkv.semantic.options import add_semantic_arguments
    from hybridkv.serving.options import add_serve_arguments

    add_serve_arguments(p)
    add_semantic_arguments(p)


def _run_serve(args: argparse.Namespace) -> int:
    from hybridkv.serving.server import run_server

    return run_server(args)


# ---- route ------------------------------------------------------------------

def _route_args(p: argparse.ArgumentParser) -> None:
    from hybridkv.semantic.options import add_semantic_arguments
    from hybridkv.serving.router.server import add_route_arguments

    add_route_arguments(p)
    add_semantic_arguments(p)


def _run_route(args: argparse.Namespace) -> int:
    from hybridkv.serving.router.server import run_router

    return run_router(args)


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str = ""


COMMANDS: dict[str, Command] = {
    "demo": Command("run the presets over three workloads, write plots", _demo_args, _run_demo),
    "simulate": Command("capacity planning: replay a trace through the manager",
                        _simulate_args, _run_simulate),
    "route": Command("route OpenAI requests across hybridkv serve instances by what their "
                     "KV caches can reuse", _route_args, _run_route),
    "bench": Command("run a benchmark script of a source checkout", _bench_args, _run_bench,
                     "Runs benchmarks/NAME's script; results go to --out DIR, never over "
                     "the committed figures in benchmarks/results unless asked."),
    "serve": Command("serve a model over the OpenAI HTTP API", _serve_args, _run_serve),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hybridkv", description="prefix caching for hybrid LLMs")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.help,
                                             description=command.description or command.help))
    return parser


def _add_serve(sub) -> None:
    """`hybridkv serve MODEL`: the OpenAI-compatible server (hybridkv.serving)."""
    from hybridkv.serving.options import add_serve_arguments

    serve = sub.add_parser("serve", help="serve a model over the OpenAI HTTP API")
    add_serve_arguments(serve)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hybridkv` console script; returns the exit code."""
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:
        print(version_text())  # before the parser: some commands' options import torch
        raise SystemExit(0)
    args = build_parser().parse_args(argv)
    try:
        code = COMMANDS[args.command].run(args)
    except (ValueError, FileNotFoundError) as e:
        code = _fail(f"hybridkv {args.command}", str(e).splitlines()[0])
    if argv is None:  # a process of its own, about to exit: the collection at exit would
        gc.freeze()  # walk torch's module objects once more (seconds) to free nothing
    return code


if __name__ == "__main__":
    sys.exit(main())
