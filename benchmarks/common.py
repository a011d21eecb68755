"""Shared helpers of the benchmark scripts: output folder, machine info, result files.

Every script writes its JSON into `--out DIR` (default `./hybridkv-bench-output`
in the current directory, which git ignores), never over the committed
figures in `benchmarks/results/` unless asked to (`--out benchmarks/results`).
`--quick` runs the smallest settings (seconds), to check that a script works.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = "hybridkv-bench-output"


def add_common_args(ap: argparse.ArgumentParser) -> None:
    """--out DIR and --quick, the same in every script."""
    ap.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                    help=f"folder for the JSON results (default: ./{DEFAULT_OUT}; "
                         "benchmarks/results holds the committed figures)")
    ap.add_argument("--quick", action="store_true",
                    help="smallest settings, a few seconds: checks the script runs")


def prepare_out(out_dir: str) -> str:
    """Create `out_dir` and check it is writable, before any work; exit naming it if not."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise SystemExit(f"--out {out_dir}: cannot write there ({e.strerror or e})") from e
    return out_dir


def machine() -> dict:
    """Platform, CPU model, cores and Python version of this machine."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "python": sys.version.split()[0]}


def write_result(name: str, result: dict, out_dir: str) -> str:
    """Write `result` (plus machine info) as `out_dir/name.json`; the path."""
    path = os.path.join(prepare_out(out_dir), f"{name}.json")
    with open(path, "w") as f:
        json.dump({"machine": machine(), **result}, f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def shared_bench_dir(path: str) -> str:
    """The folder of the shared cross-check workload (holding traces.py), or exit naming it."""
    if not os.path.isfile(os.path.join(path, "traces.py")):
        raise SystemExit(f"--shared-bench {path}: no traces.py there (the shared workload "
                         "folder the vLLM figures were measured with)")
    return os.path.abspath(path)


def add_replay_args(ap: argparse.ArgumentParser) -> None:
    """The scheduler-path replay's knobs, as the shared-prefix benchmarks use them."""
    ap.add_argument("--num-blocks", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--max-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--hash-algo", default="sha256")
