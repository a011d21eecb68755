"""A router's own hop, timed against a backend that answers at once.

One `canned_backend.py` (canned streamed replies, no model) and every target
in front of it; the same request is sent one at a time to each target, in a
shuffled order each round. Two kinds of request, measured one after the
other: `ids`, a streamed completion with a 330-token-id prompt (no
tokenizing: the hop and the decision), and `chat`, a streamed chat request
(a 120-word system message and a question) that the router tokenizes with
`--tokenizer` (gemma3-tiny's). Per target and kind: time to the first
content event (TTFT) and to the end of the stream, median and p99; the
router's added latency (per-round differences against `direct`, median and
p99); and the CPU time the router process used per request (user + system,
all threads; routers run with `--check-interval 60`, so health checks do not
count). CPU time is the figure that holds on a busy machine.

    PYTHONPATH=. python benchmarks/bench_router_hop.py --out DIR --rounds 200 \\
        --base-tree /path/to/other/checkout --router-python VENV/bin/python

Targets: `direct` (the canned backend), `hybridkv` (the router of this tree),
`hybridkv@base` (of `--base-tree`, first on PYTHONPATH), `hybridkv-fast` (this
tree run by `--router-python`, a Python with uvloop and httptools, which
uvicorn then uses).
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
from bench_router_overhead import cpu_seconds  # noqa: E402
from bench_routers import percentile  # noqa: E402
from common import prepare_out, write_result  # noqa: E402
from router_backends import Process, free_port, wait_health  # noqa: E402

from hybridkv.tools.tokenizer_checkpoint import sample_text, save_preset_tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = ["direct", "hybridkv", "hybridkv@base", "hybridkv-fast"]


def start(args, log_dir: str, tokenizer_dir: str, out: dict[str, tuple]) -> None:
    """Fill `out`: target name -> (URL, Process), the backend under "direct" (those
    started before a failure stay in `out`, to be stopped)."""
    port = free_port()
    backend = Process([sys.executable, os.path.join(HERE, "canned_backend.py"), "--port",
                       str(port)], os.path.join(log_dir, "backend.log"))
    out["direct"] = (f"http://127.0.0.1:{port}", backend)
    wait_health(out["direct"][0], backend.proc, 600)
    for name in args.targets.split(","):
        if name == "direct":
            continue
        python = args.router_python if name == "hybridkv-fast" else sys.executable
        env = {"PYTHONPATH": os.path.abspath(args.base_tree)} if name == "hybridkv@base" \
            else None
        if name == "hybridkv@base" and not args.base_tree:
            raise ValueError("target 'hybridkv@base' needs --base-tree")
        router_port = free_port()
        argv = [python, "-m", "hybridkv.tools.cli", "route", "--policy", "hybrid-prefix",
                "--port", str(router_port), "--check-interval", "60", "--log-level",
                "warning", "--backend", out["direct"][0], "--tokenizer", tokenizer_dir]
        out[name] = (f"http://127.0.0.1:{router_port}",
                     Process(argv, os.path.join(log_dir, f"{name}.log"), env))
    for url, proc in out.values():
        wait_health(url, proc.proc, 600)


def bodies(args) -> dict[str, tuple[str, dict]]:
    words = sample_text().split()
    rng = random.Random(args.seed)
    return {"ids": ("/v1/completions", {
                "model": "canned", "prompt": [rng.randrange(3, 250) for _ in range(330)],
                "max_tokens": 4, "stream": True}),
            "chat": ("/v1/chat/completions", {
                "model": "canned", "max_tokens": 4, "stream": True, "messages": [
                    {"role": "system", "content": " ".join(words[:120])},
                    {"role": "user", "content": " ".join(words[200:212]) + "?"}]})}


async def one(client: httpx.AsyncClient, url: str, path: str, body: dict) -> tuple:
    """Seconds to the first content event and to the end of the stream."""
    start = time.perf_counter()
    first = None
    async with client.stream("POST", url + path, json=body) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: {reply.status_code} {(await reply.aread())[:200]!r}")
        async for chunk in reply.aiter_raw():
            if first is None and b'"content"' in chunk:
                first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - start, end - start


async def measure(targets: dict[str, tuple], kind: str, path: str, body: dict,
                  args) -> dict[str, dict]:
    samples: dict[str, list[tuple]] = {name: [] for name in targets}
    names = list(targets)
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(args.warmup):
            for name in names:
                await one(client, targets[name][0], path, body)
        cpu_start = cpu_seconds(targets)
        for _ in range(args.rounds):
            rng.shuffle(names)
            for name in names:
                samples[name].append(await one(client, targets[name][0], path, body))
        cpu_end = cpu_seconds(targets)
    return {name: summarize(runs, samples["direct"],
                            (cpu_end[name] - cpu_start[name]) / args.rounds)
            for name, runs in samples.items()}


def summarize(runs: list[tuple], direct: list[tuple], cpu: float) -> dict:
    ttft = [r[0] for r in runs]
    added = [r[0] - d[0] for r, d in zip(runs, direct)]
    return {"n": len(runs), "ttft_p50_ms": 1e3 * statistics.median(ttft),
            "ttft_p99_ms": 1e3 * percentile(ttft, 0.99),
            "end_p50_ms": 1e3 * statistics.median(r[1] for r in runs),
            "added_p50_ms": 1e3 * statistics.median(added),
            "added_p99_ms": 1e3 * percentile(added, 0.99),
            "cpu_ms_per_request": 1e3 * cpu}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--targets", default=",".join(TARGETS[:2]))
    ap.add_argument("--base-tree", default=None, metavar="DIR")
    ap.add_argument("--router-python", default=sys.executable)
    ap.add_argument("--kinds", default="ids,chat")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = prepare_out(args.out)
    log_dir = os.path.join(out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    tokenizer_dir = tempfile.mkdtemp(prefix="hybridkv-tok-")
    save_preset_tokenizer(tokenizer_dir, "gemma3-tiny")
    targets: dict[str, tuple] = {}
    try:
        start(args, log_dir, tokenizer_dir, targets)
        result = {kind: asyncio.run(measure(targets, kind, *bodies(args)[kind], args))
                  for kind in args.kinds.split(",")}
    finally:
        for _, proc in targets.values():
            proc.stop()
    for kind, rows in result.items():
        for name, row in rows.items():
            print(kind, name, json.dumps({k: round(v, 3) for k, v in row.items()}))
    report = {"config": vars(args), "load_average": os.getloadavg(), "kinds": result}
    print(write_result("router-hop", report, out))
    return report


if __name__ == "__main__":
    main()
