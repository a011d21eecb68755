"""Serving benchmark: `hybridkv serve` under an open-loop client (not a test).

Three measurements, each against a real server subprocess on 127.0.0.1:

1. overhead: the same requests (32-token prompts, 8 output tokens), one at a
   time, over HTTP (non-streamed, keep-alive connection) and through an
   in-process `LLM.generate` with the same engine settings, alternated; the
   per-request difference is the HTTP + JSON + tokenization + engine-thread
   hand-off cost. Token-id prompts and text prompts (tokenized by the server,
   by `LLM.generate` in process). Wall time, and CPU time (server process +
   client against the in-process call), which other jobs on a shared machine
   disturb far less.
2. low-load TTFT: streamed requests one at a time: a 2,048-token document
   (cached by a first request) plus a new 32-token question, against a new
   32-token question alone. TTFT is the time to the first streamed token.
3. open loop: Poisson arrivals at several rates (TTFT measured from the
   scheduled arrival, so a slow server cannot slow the client down), over the
   shared-document workload (4 documents of 2,048 tokens + 32-token
   questions) and a multi-turn chat (16 sessions sharing a 256-token system
   prompt, 64-token user turns, each turn re-sending the conversation; a
   turn waits for its session's previous answer), prefix caching on and off.
   The documents are requested once, untimed, before each rate (they are in
   use already in the situation measured).
   Per rate: TTFT p50/p99, inter-token latency p50/mean, output tokens/s and
   the fraction of prompt tokens served from the cache; the highest rate
   whose p99 TTFT stays within 1 s. A rate sweep of one setting stops once
   p99 TTFT passes `--give-up-ttft`.

    python benchmarks/bench_serving.py --out /tmp/bench-serving
    python benchmarks/bench_serving.py --quick       # one rate, a few requests: checks it runs

Writes `serving_<preset>.json` and `ttft_vs_rate.png` into `--out` (default
`./hybridkv-bench-output`, which git ignores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
from common import add_common_args, prepare_out, write_result

# ---- servers -------------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`hybridkv serve` as a subprocess, stopped with SIGTERM."""

    def __init__(self, model: str, *args: str, log_dir: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(log_dir, f"server-{self.port}.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridkv.tools.cli", "serve", model, "--port",
             str(self.port), "--log-level", "warning", *args],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited; see {self.log.name}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise SystemExit("server did not start")

    def cpu_seconds(self) -> float:
        """User + system CPU the server process has used (all its threads)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)
        self.log.close()


# ---- one request ---------------------------------------------------------------------

@dataclass
class Record:
    ttft: float = float("nan")
    itls: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    finished: float = 0.0


async def stream_request(client: httpx.AsyncClient, url: str, body: dict,
                         start: float) -> Record:
    """Stream one completion; times relative to `start` (perf_counter)."""
    rec = Record()
    last = None
    body = {**body, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            for choice in chunk["choices"]:
                if choice.get("token_ids"):
                    if last is None:
                        rec.ttft = now - start
                    else:
                        rec.itls.append((now - last) / len(choice["token_ids"]))
                    last = now
                    rec.tokens.extend(choice["token_ids"])
            if chunk.get("usage"):
                rec.prompt_tokens = chunk["usage"]["prompt_tokens"]
                rec.cached_tokens = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    rec.finished = time.perf_counter()
    return rec


# ---- workloads -----------------------------------------------------------------------

def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(n)]


class SharedDocuments:
    """Each request: one of a few long documents plus a new question."""

    def __init__(self, seed: int, num_docs: int = 4, doc_len: int = 2048, question_len: int = 32):
        self.rng = random.Random(seed)
        self.docs = [tokens(self.rng, doc_len) for _ in range(num_docs)]
        self.question_len = question_len

    async def prompt(self, i: int) -> list[int]:
        return self.docs[i % len(self.docs)] + tokens(self.rng, self.question_len)

    def done(self, i: int, prompt: list[int], output: list[int]) -> None:
        pass

    def warm_up(self, url: str) -> None:
        """One untimed request per document: the documents are in use before the run
        (caching off computes them again anyway)."""
        for doc in self.docs:
            httpx.post(f"{url}/v1/completions", json={"prompt": doc + [3], "max_tokens": 1},
                       timeout=300).raise_for_status()


class MultiTurn:
    """Sessions sharing a system prompt; turn k of a session re-sends turns < k."""

    def __init__(self, seed: int, num_sessions: int = 16, system_len: int = 256,
                 user_len: int = 64):
        self.rng = random.Random(seed)
        system = tokens(self.rng, system_len)
        self.history = [list(system) for _ in range(num_sessions)]
        self.ready = [asyncio.Event() for _ in range(num_sessions)]
        for event in self.ready:
            event.set()
        self.user_len = user_len

    async def prompt(self, i: int) -> list[int]:
        s = i % len(self.history)
        await self.ready[s].wait()  # the previous turn's answer is part of this prompt
        self.ready[s].clear()
        if len(self.history[s]) > 3000:  # a long session starts over
            self.history[s] = self.history[s][:256]
        return self.history[s] + tokens(self.rng, self.user_len)

    def done(self, i: int, prompt: list[int], output: list[int]) -> None:
        s = i % len(self.history)
        self.history[s] = prompt + output
        self.ready[s].set()

    def warm_up(self, url: str) -> None:
        """Nothing: every session starts cold (only the system prompt is shared)."""


async def open_loop(url: str, workload, rate: float, num_requests: int, output_len: int,
                    seed: int) -> tuple[list[Record], float]:
    """Send `num_requests` with Poisson arrivals at `rate`/s; records and wall seconds."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter() + 0.05
        arrivals, t = [], t0
        for _ in range(num_requests):
            arrivals.append(t)
            t += rng.expovariate(rate)

        async def one(i: int) -> Record:
            await asyncio.sleep(max(0.0, arrivals[i] - time.perf_counter()))
            prompt = await workload.prompt(i)
            body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0,
                    "ignore_eos": True}
            rec = await stream_request(client, url, body, arrivals[i])
            workload.done(i, prompt, rec.tokens)
            return rec

        records = await asyncio.gather(*(one(i) for i in range(num_requests)))
    return records, max(r.finished for r in records) - t0


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


def summarize(records: list[Record], seconds: float) -> dict:
    ttfts = [r.ttft for r in records]
    itls = [x for r in records for x in r.itls]
    prompt = sum(r.prompt_tokens for r in records)
    return {"requests": len(records), "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p99_s": percentile(ttfts, 99), "itl_p50_s": percentile(itls, 50),
            "itl_mean_s": statistics.fmean(itls) if itls else float("nan"),
            "output_tokens_per_s": sum(len(r.tokens) for r in records) / seconds,
            "cached_fraction": sum(r.cached_tokens for r in records) / max(prompt, 1)}


# ---- the three measurements ----------------------------------------------------------

def overhead(args, log_dir: str) -> dict:
    """Per-request cost of HTTP (+ tokenization) over `LLM.generate` of the same request."""
    import torch

    from hybridkv import LLM, SamplingParams
    from hybridkv.tools.tokenizer_checkpoint import sample_text, save_checkpoint_with_tokenizer

    torch.set_num_threads(1)
    model = args.preset
    if LLM(model).tokenizer is None:  # text needs a tokenizer: the preset's weights plus one
        model = str(save_checkpoint_with_tokenizer(os.path.join(log_dir, "ckpt"), args.preset))
    llm = LLM(model)
    server = Server(model, "--threads", "1", log_dir=log_dir)
    rng = random.Random(args.seed)
    words = sample_text().split()
    n, out_len = args.overhead_requests, 8
    params = SamplingParams(max_tokens=out_len, ignore_eos=True)
    result = {}
    try:
        with httpx.Client(timeout=60) as client:
            for kind in ("token_ids", "text"):
                prompts = [tokens(rng, 32) if kind == "token_ids"
                           else " ".join(rng.choice(words) for _ in range(24))
                           for _ in range(n + 5)]
                http, local = [], []
                cpu = {"server": 0.0, "client": 0.0, "generate": 0.0}
                for i, p in enumerate(prompts):
                    body = {"prompt": p, "max_tokens": out_len, "temperature": 0,
                            "ignore_eos": True}
                    server_cpu, c, t = server.cpu_seconds(), time.process_time(), \
                        time.perf_counter()
                    r = client.post(f"{server.url}/v1/completions", json=body)
                    http.append(time.perf_counter() - t)
                    if i >= 5:  # the first few warm both paths up
                        cpu["client"] += time.process_time() - c
                        cpu["server"] += server.cpu_seconds() - server_cpu
                    assert r.status_code == 200, r.text
                    c, t = time.process_time(), time.perf_counter()
                    llm.generate([p], params)
                    local.append(time.perf_counter() - t)
                    if i >= 5:
                        cpu["generate"] += time.process_time() - c
                http, local = http[5:], local[5:]
                diffs = [h - g for h, g in zip(http, local)]
                result[kind] = {
                    "http_median_s": statistics.median(http),
                    "generate_median_s": statistics.median(local),
                    "overhead_median_s": statistics.median(diffs),
                    "overhead_p10_s": percentile(diffs, 10),
                    "overhead_p90_s": percentile(diffs, 90), "requests": n,
                    # CPU seconds per request: far less sensitive to other jobs than wall time
                    "cpu_server_per_request_s": cpu["server"] / n,
                    "cpu_client_per_request_s": cpu["client"] / n,
                    "cpu_generate_per_request_s": cpu["generate"] / n,
                    "cpu_overhead_per_request_s": (cpu["server"] + cpu["client"]
                                                   - cpu["generate"]) / n}
                print(kind, json.dumps(result[kind]), flush=True)
    finally:
        server.stop()
    return result


def low_load_ttft(args, log_dir: str) -> dict:
    """TTFT of a cached 2,048-token document + 32-token question vs the question alone."""
    server = Server(args.preset, "--threads", str(args.threads), log_dir=log_dir)
    rng = random.Random(args.seed + 1)
    doc = tokens(rng, 2048)

    async def run() -> dict:
        async with httpx.AsyncClient(timeout=120) as client:
            async def ttft(prompt):
                rec = await stream_request(client, server.url, {
                    "prompt": prompt, "max_tokens": 1, "temperature": 0}, time.perf_counter())
                return rec.ttft, rec.cached_tokens

            await ttft(doc + tokens(rng, 32))  # caches the document
            for _ in range(3):
                await ttft(tokens(rng, 32))
            hits, alone, cached = [], [], []
            for _ in range(args.ttft_repeats):
                t, c = await ttft(doc + tokens(rng, 32))
                hits.append(t)
                cached.append(c)
                alone.append((await ttft(tokens(rng, 32)))[0])
            return {"ttft_hit_p50_s": statistics.median(hits),
                    "ttft_suffix_alone_p50_s": statistics.median(alone),
                    "hit_over_suffix": statistics.median(hits) / statistics.median(alone),
                    "cached_tokens_of_hit": statistics.median(cached),
                    "repeats": args.ttft_repeats}

    try:
        result = asyncio.run(run())
    finally:
        server.stop()
    print("low-load ttft", json.dumps(result), flush=True)
    return result


def sweep(args, log_dir: str) -> dict:
    """TTFT and throughput against the request rate, caching on and off; the two
    servers run side by side and take turns at each rate (a noisy machine then
    disturbs both alike)."""
    out: dict = {}
    workloads = {"shared_documents": SharedDocuments, "multi_turn": MultiTurn}
    for name in args.workloads.split(","):
        servers = {key: Server(args.preset, "--threads", str(args.threads), "--max-queue",
                               "100000", *flags, log_dir=log_dir)
                   for key, flags in (("on", []), ("off", ["--no-prefix-caching"]))}
        rows: dict[str, list[dict]] = {"on": [], "off": []}
        try:
            for rate in args.rates:
                for key, server in servers.items():
                    if rows[key] and rows[key][-1]["ttft_p99_s"] > args.give_up_ttft:
                        continue  # past saturation already
                    rows[key].append(run_rate(args, server.url, workloads[name], rate))
                    print(name, "caching", key, json.dumps(rows[key][-1]), flush=True)
        finally:
            for server in servers.values():
                server.stop()
        out[name] = {key: {"rows": rows[key], "max_rate_p99_ttft_1s": max(
            [r["rate"] for r in rows[key] if r["ttft_p99_s"] <= 1.0], default=0.0)}
            for key in rows}
        on, off = (out[name][k]["max_rate_p99_ttft_1s"] for k in ("on", "off"))
        out[name]["on_over_off"] = on / off if off else float("inf")
    return out


def run_rate(args, url: str, make, rate: float) -> dict:
    """One open-loop run at `rate` of a fresh workload; its summary."""
    n = max(args.min_requests, min(args.max_requests, round(rate * args.duration)))
    workload = make(args.seed)
    workload.warm_up(url)
    records, seconds = asyncio.run(open_loop(url, workload, rate, n, args.output_len,
                                             args.seed))
    return {"rate": rate, **summarize(records, seconds)}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result)
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        for key, color in (("on", "tab:blue"), ("off", "tab:red")):
            rows = result[name][key]["rows"]
            rates = [r["rate"] for r in rows]
            label = f"caching {key}"
            ax.plot(rates, [r["ttft_p50_s"] for r in rows], "o-", color=color,
                    label=f"{label} p50")
            ax.plot(rates, [r["ttft_p99_s"] for r in rows], "s--", color=color,
                    label=f"{label} p99")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="request rate (req/s, Poisson)",
               ylabel="time to first token (s)", title=name.replace("_", " "))
        rates = sorted({r["rate"] for k in ("on", "off") for r in result[name][k]["rows"]})
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gemma3-tiny")
    ap.add_argument("--rates", default="2,4,8,16,32,64,128")
    ap.add_argument("--workloads", default="shared_documents,multi_turn")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per rate")
    ap.add_argument("--min-requests", type=int, default=24)
    ap.add_argument("--max-requests", type=int, default=600)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--give-up-ttft", type=float, default=5.0)
    ap.add_argument("--overhead-requests", type=int, default=60)
    ap.add_argument("--ttft-repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", default="", help="comma list of overhead,ttft,sweep to skip")
    add_common_args(ap)
    args = ap.parse_args(argv)
    if args.quick:  # checks the script runs: one rate, few requests
        args.rates, args.duration, args.min_requests = "8", 1.0, 4
        args.overhead_requests, args.ttft_repeats = 5, 2
    args.rates = [float(r) for r in args.rates.split(",")]
    prepare_out(args.out)
    skip = set(filter(None, args.skip.split(",")))
    result: dict = {"preset": args.preset, "config": vars(args)}
    if "overhead" not in skip:
        result["overhead"] = overhead(args, args.out)
    if "ttft" not in skip:
        result["low_load_ttft"] = low_load_ttft(args, args.out)
    if "sweep" not in skip:
        result["sweep"] = sweep(args, args.out)
        plot(result["sweep"], os.path.join(args.out, "ttft_vs_rate.png"))
    print("wrote", write_result(f"serving_{args.preset}", result, args.out))
    return result


if __name__ == "__main__":
    main()
