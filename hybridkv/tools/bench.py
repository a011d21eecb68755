"""`hybridkv bench NAME`: run one of the benchmark scripts of a source checkout.

The scripts live in the repository's `benchmarks/` folder, beside the
package (an editable install or `PYTHONPATH` pointing at a checkout); an
installed wheel has no such folder and gets a clear error. A script runs in
the caller's current directory, so its default output folder
(`./hybridkv-bench-output`) is there too, and with the package of this
checkout importable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import NamedTuple


class Script(NamedTuple):
    file: str
    summary: str


SCRIPTS = {
    "hashing": Script("bench_hashing.py", "block hashing ns/token (C and pure Python)"),
    "pool": Script("bench_pool.py", "block pool operations against pool size"),
    "lookup": Script("bench_lookup.py", "prefix lookup cost against prefix length"),
    "replay": Script("bench_replay.py", "scheduler-path replay, requests/s (full, swa, mamba)"),
    "engine": Script("bench_engine.py", "engine TTFT hit/miss and requests/s, caching on/off"),
    "pressure": Script("bench_pressure.py", "hit rate under memory pressure per policy"),
    "pressure_seeds": Script("bench_pressure_seeds.py", "pressure hit rates over trace seeds"),
    "mamba_state": Script("bench_mamba_state.py", "Mamba state memory during a long decode"),
    "soak": Script("soak.py", "fuzzing soak of the manager state machine"),
    "serving": Script("bench_serving.py", "HTTP server: overhead, TTFT hit/suffix, load sweep"),
    "routing": Script("bench_routing.py", "router decision time, 64 instances, 1M blocks"),
    "cluster": Script("bench_cluster.py", "routing policies on simulated clusters (8-64)"),
    "store_view": Script("bench_store_view.py",
                         "router: shared KV store query and decision, 64 instances"),
    "store_ttft": Script("bench_store.py", "KV store: TTFT recompute vs load from cpu/file/redis"),
    "store_pressure": Script("bench_store_pressure.py",
                             "hit rate under pressure with a cpu tier of 1-4x the pool"),
    "store_replay": Script("bench_store_replay.py", "replay requests/s with a KV store attached"),
    "file_store": Script("bench_file_store.py", "file store throughput against object size"),
}

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def benchmarks_dir() -> str:
    """The benchmarks/ folder beside the package (a source checkout)."""
    path = os.path.join(PACKAGE_ROOT, "benchmarks")
    if not os.path.isfile(os.path.join(path, "common.py")):
        raise FileNotFoundError(
            f"the benchmark scripts are not installed with the package (no benchmarks/ in "
            f"{PACKAGE_ROOT}); run `hybridkv bench` from a source checkout: clone the "
            f"repository and `pip install -e .` there, or set PYTHONPATH to the checkout")
    return path


def run_bench(name: str, args: list[str]) -> int:
    """Run benchmark `name` with `args` in the current directory; its exit code."""
    if name not in SCRIPTS:
        raise ValueError(f"unknown benchmark {name!r}; use one of {', '.join(SCRIPTS)}")
    script = os.path.join(benchmarks_dir(), SCRIPTS[name].file)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"benchmark script {script} is missing")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.call([sys.executable, script, *args], env=env)
