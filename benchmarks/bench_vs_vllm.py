"""Scheduler-path replay through hybridkv's and vLLM's KV cache managers, same sitting.

The trace is the project's own (`shared_prefix_trace`: 2,000 requests, a
1,024-token shared prefix + 256 unique tokens, then 64 decode steps), written
once to a trace file that both sides read and check against its fingerprint.
Both sides run the same replay driver (`hybridkv.tools.replay`: 64 running,
8,192 tokens per step) over a pool of 4,096 blocks of 16 tokens with sha256
block hashes, on three configs: full attention, full + sliding window 1,024,
full + Mamba. vLLM's side is its v1 `KVCacheManager` driven the way its
scheduler drives it (`vllm_adapter.py`).

Every run is a fresh process (`vs_vllm_worker.py`): hybridkv under this
Python, vLLM under `--vllm-python`, a separate environment with vLLM 0.32.0
and a CPU torch (vLLM's compiled kernels are not needed by the manager). The
two sides alternate, and which goes first swaps every round. Reported per
config: median requests/s and range of each side, over wall time and over
the worker's CPU time (steadier when other jobs share the cores), the ratio
of the medians and the median of the per-round ratios (and, in the JSON, the
ratio of the time spent inside the managers' calls alone), the hit rates (each request's cached
tokens compared side by side), leaked blocks, and the load average around
the runs. Writes DIR/vs_vllm.json and DIR/vs_vllm.md.

    python benchmarks/bench_vs_vllm.py --vllm-python /work/venvs/vllm/bin/python \\
        [--rounds 3] [--configs full,swa,mamba] [--out DIR] [--quick]

The vLLM environment (kept apart from the one hybridkv's tests use):

    python -m venv VENV
    VENV/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    VENV/bin/pip install vllm==0.32.0 --no-deps
    VENV/bin/pip install -r benchmarks/vllm-requirements.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import add_common_args, prepare_out, write_result

from hybridkv.tools.bench_traces import shared_prefix_trace
from hybridkv.tools.replay import CONFIG_GROUPS
from hybridkv.tools.trace_file import save_trace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "vs_vllm_worker.py")
VLLM_VERSION = "0.32.0"
VLLM_ENV = "HYBRIDKV_VLLM_PYTHON"
SETUP_HINT = ("make one as the docstring of benchmarks/bench_vs_vllm.py shows, then pass "
              f"--vllm-python VENV/bin/python (or set {VLLM_ENV})")
CHECK_VLLM = ("import vllm, vllm.v1.core.kv_cache_manager, vllm.v1.core.sched.scheduler; "
              "print(vllm.__version__)")


def worker_env() -> dict:
    """This checkout first on PYTHONPATH, so both sides use its trace reader and driver."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def check_vllm(python: str | None) -> str:
    """The vLLM version `python` imports; exit with what is missing when it cannot."""
    if not python:
        raise SystemExit(f"bench_vs_vllm: no Python with vLLM {VLLM_VERSION} given; "
                         + SETUP_HINT)
    try:
        done = subprocess.run([python, "-c", CHECK_VLLM], capture_output=True, text=True,
                              timeout=300, env=worker_env())
    except OSError as e:
        raise SystemExit(f"bench_vs_vllm: --vllm-python {python}: cannot run it "
                         f"({e.strerror or e}); " + SETUP_HINT) from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"bench_vs_vllm: --vllm-python {python} cannot import vLLM's KV "
                         f"cache manager: {last}; " + SETUP_HINT)
    version = done.stdout.strip().splitlines()[-1]
    if version != VLLM_VERSION:
        raise SystemExit(f"bench_vs_vllm: --vllm-python {python} has vLLM {version}; the "
                         f"adapter follows vLLM {VLLM_VERSION}'s scheduler. " + SETUP_HINT)
    return version


def run_worker(python: str, side: str, config: str, trace_path: str, fingerprint: str,
               warmup: int) -> dict:
    """One timed replay in a fresh process; its RESULT plus the load average around it."""
    cmd = [python, WORKER, "--side", side, "--config", config, "--trace", trace_path,
           "--fingerprint", fingerprint, "--warmup", str(warmup)]
    result = run_json(cmd, "RESULT ", f"bench_vs_vllm: {side} {config}")
    if result["fingerprint"] != fingerprint:
        raise SystemExit(f"bench_vs_vllm: {side} replayed trace {result['fingerprint']}, "
                         f"not {fingerprint}")
    return result


def run_json(cmd: list[str], marker: str, what: str) -> dict:
    """Run `cmd` (this checkout on PYTHONPATH); the JSON of its last line starting
    with `marker`, plus the load average around the run. Exits naming `what`
    with the end of its stderr when it fails."""
    load_before = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=worker_env())
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(marker)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len(marker):])
    result["load_avg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result


def spread(values: list[float]) -> dict:
    """Median, range and (max - min) / median of some runs' figures."""
    mid = statistics.median(values)
    return {"runs": values, "median": mid, "min": min(values), "max": max(values),
            "spread": round((max(values) - min(values)) / mid, 3)}


def side_summary(runs: list[dict]) -> dict:
    """requests/s (wall and CPU time), per-call medians, hits and leaks of one side."""
    hit_rates = sorted({r["hit_rate"] for r in runs})
    return {"requests_per_s": spread([r["requests_per_s"] for r in runs]),
            "requests_per_cpu_s": spread([r["requests_per_cpu_s"] for r in runs]),
            "manager_s": spread([r["manager_s"] for r in runs]),
            "hit_rate": hit_rates[0] if len(hit_rates) == 1 else hit_rates,
            "leaked_blocks": max(r["leaked_blocks"] for r in runs),
            "steps": sorted({r["steps"] for r in runs}),
            "preemptions": sorted({r["preemptions"] for r in runs}),
            **{f"{call}_mean_us": round(statistics.median(r[f"{call}_mean_us"] for r in runs), 1)
               for call in ("start", "lookup", "allocate_prefill", "allocate_decode", "append",
                            "free", "new_step")}}


def hit_differences(ours: dict, theirs: dict, request_ids: list[str]) -> list[dict]:
    """Requests whose cached tokens at admission differ between the two sides."""
    return [{"request": rid, "hybridkv": a, "vllm": b}
            for rid, a, b in zip(request_ids, ours["request_hits"], theirs["request_hits"])
            if a != b]


def ratios(runs: dict[str, list[dict]], ours: dict, theirs: dict, key: str) -> dict:
    """hybridkv / vLLM on `key`: of the medians, and per round (the two runs side by side)."""
    paired = [round(a[key] / b[key], 2) for a, b in zip(runs["hybridkv"], runs["vllm"])]
    return {"of_medians": round(ours[key]["median"] / theirs[key]["median"], 2),
            "per_round": paired, "per_round_median": statistics.median(paired)}


def config_summary(runs: dict[str, list[dict]], request_ids: list[str]) -> dict:
    ours, theirs = side_summary(runs["hybridkv"]), side_summary(runs["vllm"])
    diffs = hit_differences(runs["hybridkv"][0], runs["vllm"][0], request_ids)
    deterministic = all(r["request_hits"] == runs[s][0]["request_hits"]
                        for s in runs for r in runs[s])
    return {"hybridkv": ours, "vllm": theirs,
            "ratio": ratios(runs, ours, theirs, "requests_per_s"),
            "cpu_ratio": ratios(runs, ours, theirs, "requests_per_cpu_s"),
            "manager_time_ratio": round(theirs["manager_s"]["median"]
                                        / ours["manager_s"]["median"], 2),
            "hits_agree": not diffs, "hit_differences": diffs[:20],
            "num_hit_differences": len(diffs), "hits_same_every_run": deterministic}


def run_sitting(args, python: str, trace_path: str, fingerprint: str) -> dict:
    """All rounds; side order swaps each round, configs in the given order."""
    configs = args.configs.split(",")
    runs: dict[str, dict[str, list[dict]]] = {c: {"hybridkv": [], "vllm": []} for c in configs}
    for rnd in range(args.rounds):
        for config in configs:
            order = ("hybridkv", "vllm") if rnd % 2 == 0 else ("vllm", "hybridkv")
            for side in order:
                exe = sys.executable if side == "hybridkv" else python
                res = run_worker(exe, side, config, trace_path, fingerprint, args.warmup)
                runs[config][side].append(res)
                print(f"round {rnd + 1}/{args.rounds} {config:5s} {side:8s} "
                      f"{res['requests_per_s']:8.1f} req/s  {res['requests_per_cpu_s']:8.1f} "
                      f"per CPU s  hit {res['hit_rate']:.4f}  "
                      f"leaked {res['leaked_blocks']}  load {res['load_avg_1min']}", flush=True)
    return runs


def _figure(stats: dict) -> str:
    return f"{stats['median']:,.0f} ({stats['min']:,.0f}-{stats['max']:,.0f})"


def _ratio(r: dict) -> str:
    return (f"{r['of_medians']}x / {r['per_round_median']}x "
            f"({min(r['per_round'])}-{max(r['per_round'])})")


def markdown(summary: dict, meta: dict) -> str:
    rows = ["| config | requests/s hybridkv | requests/s vLLM | ratio: of medians / per round "
            "(range) | per CPU second hybridkv | vLLM | ratio | hit rate hybridkv / vLLM "
            "| leaked blocks |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for config, s in summary.items():
        h, v = s["hybridkv"], s["vllm"]
        hits = f"{h['hit_rate']} / {v['hit_rate']}"
        if not s["hits_agree"]:
            hits += f" ({s['num_hit_differences']} of the requests differ)"
        rows.append(f"| {config} | {_figure(h['requests_per_s'])} "
                    f"| {_figure(v['requests_per_s'])} | {_ratio(s['ratio'])} "
                    f"| {_figure(h['requests_per_cpu_s'])} | {_figure(v['requests_per_cpu_s'])} "
                    f"| {_ratio(s['cpu_ratio'])} | {hits} "
                    f"| {h['leaked_blocks']} / {v['leaked_blocks']} |")
    return (f"trace {meta['fingerprint']}, {meta['rounds']} rounds, vLLM {meta['vllm']}, "
            f"load average {meta['load_min']}-{meta['load_max']}, {meta['minutes']} minutes\n\n"
            + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=os.environ.get(VLLM_ENV), metavar="PYTHON",
                    help=f"a Python with vLLM {VLLM_VERSION} (default: ${VLLM_ENV})")
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=64, metavar="N",
                    help="untimed requests replayed first in every worker (default 64)")
    add_common_args(ap)
    args = ap.parse_args(argv)
    for config in args.configs.split(","):
        if config not in CONFIG_GROUPS:
            raise SystemExit(f"--configs: {config!r} is unknown; use {', '.join(CONFIG_GROUPS)}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    if args.quick:
        args.num_requests, args.rounds, args.warmup = 200, 1, 16
    vllm_version = check_vllm(args.vllm_python)
    prepare_out(args.out)
    trace = shared_prefix_trace(num_requests=args.num_requests)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = os.path.join(tmp, f"{trace.fingerprint()}.trace")
        save_trace(trace, trace_path)
        runs = run_sitting(args, args.vllm_python, trace_path, trace.fingerprint())
    ids = [r.request_id for r in trace.requests]
    summary = {c: config_summary(runs[c], ids) for c in runs}
    loads = [x for c in runs for s in runs[c] for r in runs[c][s] for x in r["load_avg_1min"]]
    meta = {"fingerprint": trace.fingerprint(), "rounds": args.rounds, "vllm": vllm_version,
            "load_min": min(loads), "load_max": max(loads),
            "minutes": round((time.time() - started) / 60, 1)}
    table = markdown(summary, meta)
    print(table)
    for run_list in runs.values():
        for side_runs in run_list.values():
            for r in side_runs:
                r.pop("request_hits")
    result = {"trace": trace.summary(), "meta": meta, "summary": summary, "runs": runs,
              "args": vars(args)}
    print("wrote", write_result("vs_vllm", result, args.out))
    with open(os.path.join(args.out, "vs_vllm.md"), "w") as f:
        f.write(table)
    return result


if __name__ == "__main__":
    main()
