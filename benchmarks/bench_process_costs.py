"""What one `hybridkv` process costs to start and to stop, for one or more checkouts.

    python benchmarks/bench_process_costs.py --trees /path/to/old,. --repeats 5 --out DIR

The test suite starts a few hundred processes (servers, routers, CLI runs), so
these per-process costs set much of its time. Per checkout, alternating
between checkouts within each repeat (a busy machine then disturbs all alike):

- `cli_help`: `python -m hybridkv.tools.cli bench --help` to exit: wall time
  and the CPU seconds (user + system) of the process;
- `route_help`: the same for `route --help` (a router process's start-up imports);
- `serve_stop`: `hybridkv serve gemma3-tiny` started, then SIGTERM: seconds from
  the signal to the process's exit, and the CPU seconds of the whole run.

Medians and min/max per checkout go to `DIR/process_costs.json`.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

import httpx
from common import add_common_args, prepare_out, write_result


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def env_for(tree: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.path.abspath(tree), "PYTHONUNBUFFERED": "1"}


def cli_run(tree: str, args: list[str]) -> dict:
    """One CLI process to its exit: wall and CPU seconds."""
    cpu, start = children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "hybridkv.tools.cli", *args], env=env_for(tree),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return {"wall_s": time.perf_counter() - start, "cpu_s": children_cpu() - cpu}


def serve_stop(tree: str) -> dict:
    """A gemma3-tiny server to healthy, then SIGTERM: seconds from the signal to its exit."""
    port, cpu = free_port(), children_cpu()
    proc = subprocess.Popen([sys.executable, "-m", "hybridkv.tools.cli", "serve", "gemma3-tiny",
                             "--port", str(port), "--threads", "1"], env=env_for(tree),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        start = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        stop = time.perf_counter() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0:
        raise SystemExit(f"{tree}: the server exited with {code}")
    return {"stop_s": stop, "cpu_s": children_cpu() - cpu}


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"no healthy server at {url} in {timeout}s")


MEASURES = {"cli_help": lambda tree: cli_run(tree, ["bench", "--help"]),
            "route_help": lambda tree: cli_run(tree, ["route", "--help"]),
            "serve_stop": serve_stop}


def summarize(samples: list[dict]) -> dict:
    """Per field: median, min and max over the repeats."""
    return {key: {"median": statistics.median(s[key] for s in samples),
                  "min": min(s[key] for s in samples), "max": max(s[key] for s in samples)}
            for key in samples[0]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default=".", help="checkouts to compare, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--measures", default=",".join(MEASURES))
    add_common_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.measures = 1, "cli_help,route_help"
    trees = [t for t in args.trees.split(",") if t]
    measures = [m for m in args.measures.split(",") if m]
    unknown = [m for m in measures if m not in MEASURES]
    if unknown or not trees or args.repeats < 1:
        ap.error(f"--measures from {', '.join(MEASURES)}; --trees and --repeats >= 1 needed")
    prepare_out(args.out)
    samples: dict = {m: {t: [] for t in trees} for m in measures}
    for measure in measures:
        for tree in trees:  # warm-up: the file cache, compiled bytecode
            MEASURES[measure](tree)
        for _ in range(args.repeats):
            for tree in trees:
                samples[measure][tree].append(MEASURES[measure](tree))
    result = {"repeats": args.repeats, "load_average": os.getloadavg(),
              "results": {m: {t: summarize(s) for t, s in by.items()}
                          for m, by in samples.items()}}
    for measure, by in result["results"].items():
        for tree, row in by.items():
            print(measure, tree, {k: round(v["median"], 2) for k, v in row.items()}, flush=True)
    print("wrote", write_result("process_costs", result, args.out))
    return result


if __name__ == "__main__":
    main()
