"""Shared helpers of the benchmark scripts: machine info, result files, the shared workload."""

from __future__ import annotations

import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


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


def write_result(name: str, result: dict, path: str | None = None) -> str:
    """Write `result` (plus machine info) as JSON under benchmarks/results/."""
    path = path or os.path.join(RESULTS, f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine(), **result}, f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def shared_bench_dir() -> str:
    """The shared workload folder (../shared/bench beside the repository), or exit."""
    env = os.environ.get("HYBRIDKV_SHARED_BENCH")
    candidates = [env] if env else []
    candidates += [os.path.join(HERE, "..", "..", "shared", "bench")]
    for path in candidates:
        if path and os.path.isfile(os.path.join(path, "traces.py")):
            return os.path.abspath(path)
    raise SystemExit("the shared workload (traces.py) was not found; set HYBRIDKV_SHARED_BENCH")
