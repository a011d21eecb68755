"""What a router adds to one request on an idle cluster.

One `hybridkv serve` backend (behind `field_shim.py`, as in
`bench_routers.py`) and every router in front of it at once; the same
streamed chat request (a document as system message plus a question, a few
output tokens: after the first send the backend reuses all but its last
block, so its own work is the same every time) is sent one at a time,
straight to the backend and through each router, in a shuffled order each
round. Per target: time to the response headers and to the first streamed
content (TTFT), median and p99 over the rounds, and the router's added
latency (its median minus the direct one; and the median and p99 of the
per-round differences, target minus direct); for each router process, the CPU
time it used over the measured rounds per request (health checks and other
background work included). `hybridkv route` also reports its
own stages in the `Server-Timing` header (tokenize, route, backend), whose
medians are listed.

    PYTHONPATH=. python benchmarks/bench_router_overhead.py --out /tmp/overhead \\
        --model gemma3-tiny --rounds 200

Targets: `direct` (through the shim only); `server` (the backend itself, no
shim: the cost of one Python proxy hop is `direct` minus `server`);
`hybridkv:POLICY` (tokenizing through the backend's `/tokenize`) and
`hybridkv:POLICY+tok` (`--tokenizer DIR`, the preset's tokenizer written as a
directory); `hybridkv:POLICY+tok-fast`, the same run by `--router-python` (a
Python with uvloop and httptools, which uvicorn then uses); and
`vllm-router:cache_aware`, `sglang-router:cache_aware` (the peer routers'
venv, see bench_routers.py). A `hybridkv` target ending in `@base` runs the
router of another source tree (`--base-tree DIR`, put first on PYTHONPATH),
to compare two versions of the router in one sitting:

    ... --base-tree /path/to/other/checkout \
        --targets direct,hybridkv:hybrid-prefix+tok,hybridkv:hybrid-prefix+tok@base
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_routers import percentile, router_argv  # noqa: E402
from common import prepare_out, write_result  # noqa: E402
from router_backends import Process, free_port, start_backends, wait_health  # noqa: E402

from hybridkv.tools.tokenizer_checkpoint import sample_text, save_preset_tokenizer  # noqa: E402

TARGETS = ["direct", "hybridkv:hybrid-prefix", "hybridkv:hybrid-prefix+tok",
           "hybridkv:prefix+tok", "hybridkv:round-robin+tok", "vllm-router:cache_aware",
           "sglang-router:cache_aware"]


def start_routers(args, backends, log_dir: str, tokenizer_dir: str,
                  out: dict[str, tuple]) -> None:
    """Fill `out`: target name -> (URL, Process or None) for every target, all
    started (those started before a failure stay in `out`, to be stopped)."""
    out["direct"] = (backends[0].url, None)
    for name in args.targets.split(","):
        if name == "server":  # the backend itself, without the field shim's hop
            out[name] = (backends[0].server_url, None)
        if name in ("direct", "server"):
            continue
        spec, _, tree = name.partition("@")
        router, _, tok = spec.partition("+")
        port = free_port()
        python = args.router_python if tok.endswith("fast") else sys.executable
        argv = router_argv(router, port, backends, args.venv, args.model, python)
        if tok:
            argv += ["--tokenizer", tokenizer_dir]
        env = None
        if tree:
            if tree != "base" or not args.base_tree:
                raise ValueError(f"target {name!r}: '@base' needs --base-tree")
            env = {"PYTHONPATH": os.path.abspath(args.base_tree)}
        log = os.path.join(log_dir, f"router-{name.replace(':', '-')}.log")
        out[name] = (f"http://127.0.0.1:{port}", Process(argv, log, env))
    for url, proc in out.values():
        if proc is not None:
            wait_health(url, proc.proc, 120)


async def one(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    """Seconds to the response headers and to the first content; Server-Timing."""
    start = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        headers_at = time.perf_counter()
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: {reply.status_code} {(await reply.aread())[:200]!r}")
        first = None
        async for line in reply.aiter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line:
                first = time.perf_counter()
        stages = {}
        for part in reply.headers.get("server-timing", "").split(","):
            name, _, dur = part.strip().partition(";dur=")
            if dur:
                stages[name] = float(dur) / 1e3
    return {"headers": headers_at - start, "ttft": (first or time.perf_counter()) - start,
            "stages": stages}


async def measure(targets: dict[str, tuple], args) -> dict[str, list[dict]]:
    words = sample_text().split()
    body = {"model": args.model, "max_tokens": args.max_tokens, "temperature": 0,
            "stream": True,
            "messages": [{"role": "system", "content": " ".join(words[:args.document_words])},
                         {"role": "user", "content": " ".join(words[200:212]) + "?"}]}
    samples: dict[str, list[dict]] = {name: [] for name in targets}
    rng = random.Random(args.seed)
    names = list(targets)
    cpu_at_start: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=60) as client:
        for round_ in range(args.warmup + args.rounds):
            if round_ == args.warmup:
                cpu_at_start = cpu_seconds(targets)
            rng.shuffle(names)
            for name in names:
                sample = await one(client, targets[name][0], body)
                if round_ >= args.warmup:
                    samples[name].append(sample)
    cpu = cpu_seconds(targets)
    for name, seconds in cpu.items():
        samples[name][0]["cpu_per_request"] = (seconds - cpu_at_start[name]) / args.rounds
    return samples


def cpu_seconds(targets: dict[str, tuple]) -> dict[str, float]:
    """CPU seconds (user + system, all threads) each router process has used."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, (_, proc) in targets.items():
        if proc is not None:
            with open(f"/proc/{proc.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


def summarize(samples: dict[str, list[dict]]) -> dict:
    """Per target; `added_*` against `direct`: the medians' difference, and the
    median and p99 of the per-round differences (same round, same request)."""
    direct = statistics.median(s["ttft"] for s in samples["direct"])
    out = {}
    for name, runs in samples.items():
        ttft = [s["ttft"] for s in runs]
        paired = [s["ttft"] - d["ttft"] for s, d in zip(runs, samples["direct"])]
        stages = {stage: statistics.median(s["stages"][stage] for s in runs)
                  for stage in (runs[0]["stages"] if runs else {})}
        out[name] = {"n": len(runs),
                     "headers_p50_ms": 1e3 * statistics.median(s["headers"] for s in runs),
                     "ttft_p50_ms": 1e3 * statistics.median(ttft),
                     "ttft_p99_ms": 1e3 * percentile(ttft, 0.99),
                     "added_p50_ms": 1e3 * (statistics.median(ttft) - direct),
                     "added_paired_p50_ms": 1e3 * statistics.median(paired),
                     "added_paired_p99_ms": 1e3 * percentile(paired, 0.99),
                     "cpu_ms_per_request": 1e3 * runs[0].get("cpu_per_request", 0.0),
                     "stages_p50_ms": {k: 1e3 * v for k, v in stages.items()}}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--model", default="gemma3-tiny")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--venv", default="/work/venvs/routers")
    ap.add_argument("--router-python", default=sys.executable,
                    help="the Python that runs targets named `+tok-fast` (one with uvloop "
                         "and httptools, which uvicorn then uses)")
    ap.add_argument("--base-tree", default=None, metavar="DIR",
                    help="the source tree that runs targets ending in `@base`")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--document-words", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = prepare_out(args.out)
    log_dir = os.path.join(out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    args.backends, args.num_blocks, args.model_path = 1, 400, args.model
    args.backend_engine = "hybridkv"
    tokenizer_dir = tempfile.mkdtemp(prefix="hybridkv-tok-")
    save_preset_tokenizer(tokenizer_dir, args.model)
    backends, shim = start_backends(args, log_dir)
    targets: dict[str, tuple] = {}
    try:
        start_routers(args, backends, log_dir, tokenizer_dir, targets)
        time.sleep(2.0)
        result = summarize(asyncio.run(measure(targets, args)))
    finally:
        for _, proc in targets.values():
            if proc is not None:
                proc.stop()
        shim.stop()
        backends[0].process.stop()
    for name, row in result.items():
        print(name, json.dumps(row))
    report = {"config": vars(args), "load_average": os.getloadavg(), "targets": result}
    print(write_result(f"router-overhead-{args.model}", report, out))
    return report


if __name__ == "__main__":
    main()
