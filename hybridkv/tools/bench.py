"""`hybridkv bench NAME`: run one of the benchmark scripts of a source checkout."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPTS = {
    "hashing": "bench_hashing.py",
    "pool": "bench_pool.py",
    "lookup": "bench_lookup.py",
    "replay": "bench_replay.py",
    "engine": "bench_engine.py",
    "pressure": "bench_pressure.py",
    "soak": "soak.py",
    "mamba_state": "bench_mamba_state.py",
    "serving": "bench_serving.py",
}


def benchmarks_dir() -> str:
    """The benchmarks/ folder beside the package (a source checkout)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(here, "benchmarks")
    if not os.path.isdir(path):
        raise FileNotFoundError("benchmarks/ was not found beside the package; run "
                                "`hybridkv bench` from a source checkout (pip install -e .)")
    return path


def run_bench(name: str, args: list[str]) -> int:
    """Run benchmark `name` with `args`; its exit code."""
    if name not in SCRIPTS:
        raise ValueError(f"unknown benchmark {name!r}; use one of {', '.join(SCRIPTS)}")
    script = os.path.join(benchmarks_dir(), SCRIPTS[name])
    if not os.path.isfile(script):
        raise FileNotFoundError(f"benchmark script {script} is missing")
    return subprocess.call([sys.executable, script, *args], cwd=os.path.dirname(script))
