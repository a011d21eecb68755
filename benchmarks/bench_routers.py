"""Routers side by side: N `hybridkv serve` backends behind each router in turn.

Routers: `hybridkv route` (hybrid-prefix, prefix, round-robin; caches learned
from the backends' vLLM-format ZMQ events), vllm-router (cache_aware;
kv_aware fed the same events) and sglang-router (cache_aware). Every router
gets fresh backends (cold caches) and the same workload over the chat
endpoint, streamed: conversations over shared documents (the system message
is a document; Zipf popularity), several turns each (a turn re-sends the
conversation with the real answer and waits for it plus a think time),
conversations starting at Poisson times.

Settings (`--setting`): `light` (about 3 requests/s, nothing queues) and
`loaded` (longer documents, twice the arrivals, more conversations: the
backends queue). Models: any preset, or `full-attention-tiny` (a Qwen2
checkpoint with full attention on every layer, written into --out with the
preset's tokenizer; the backends serve it under that name). `hybridkv route`
tokenizes with the model's tokenizer directory (`--tokenizer`, the preset's
written out; `--router-tokenize backend` sends each prompt to a backend's
`/tokenize` instead). `--rotate K` starts the router list at position K, so
repeated runs vary the order; `routers_report.py` takes the medians.

Per router: the cluster prefix hit rate (backends' own counters: prompt
tokens reused / looked up), TTFT p50/p99 (send to the first streamed
content), throughput (requests and output tokens per second of the run),
load imbalance (max / mean requests per backend, and the same for prompt
tokens computed), and a PNG of them.

The peer routers come from PyPI, in their own venv (not a dependency):

    python -m venv /work/venvs/routers
    /work/venvs/routers/bin/pip install vllm-router sglang-router

    PYTHONPATH=. python benchmarks/bench_routers.py --out /tmp/bench-routers \\
        --model gemma3-tiny --setting loaded --backends 3

Backends publish on `tcp://*:PORT` (bound; the routers connect to
127.0.0.1). The Rust routers add SGLang fields to the bodies they forward
(`no_stop_trim`...), which `hybridkv serve` refuses with a 400 where vLLM
ignores them: every router, hybridkv's too, reaches the backends through
`field_shim.py` (one process, one port per backend) that drops fields the
server does not know and counts them. A router that fails to start is
reported as such, not skipped silently.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import prepare_out, write_result  # noqa: E402

from hybridkv.tools.tokenizer_checkpoint import sample_text  # noqa: E402

ROUTERS = ["hybridkv:hybrid-prefix", "hybridkv:prefix", "hybridkv:round-robin",
           "vllm-router:cache_aware", "vllm-router:kv_aware", "sglang-router:cache_aware"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc: subprocess.Popen, timeout: float, path: str = "/health"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not healthy in {timeout:.0f}s")


class Process:
    def __init__(self, argv: list[str], log_path: str, env: dict | None = None) -> None:
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@dataclass
class Backend:
    url: str  # what the routers see: the field shim in front of the server
    server_url: str
    pub: int
    replay: int
    process: Process


def start_backends(args, log_dir: str) -> tuple[list[Backend], Process]:
    """Fresh servers (cold caches) and one field shim process in front of them."""
    out = []
    for i in range(args.backends):
        port, pub, replay = free_port(), free_port(), free_port()
        config = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
        argv = [sys.executable, "-m", "hybridkv.tools.cli", "serve", args.model_path,
                "--served-model-name", args.model, "--port", str(port), "--threads", "1",
                "--num-blocks", str(args.num_blocks), "--log-level", "warning",
                "--kv-events-config", json.dumps(config)]
        out.append(Backend(f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}",
                           pub, replay,
                           Process(argv, os.path.join(log_dir, f"backend{i}.log"))))
    shim_argv = [sys.executable, os.path.join(os.path.dirname(__file__), "field_shim.py"),
                 *(f"{b.url.rsplit(':', 1)[1]}={b.server_url}" for b in out)]
    shim = Process(shim_argv, os.path.join(log_dir, "shim.log"))
    for b in out:
        wait_health(b.server_url, b.process.proc, 300)
        wait_health(b.url, shim.proc, 60)
    return out, shim


def router_argv(name: str, port: int, backends: list[Backend], venv: str,
                model: str, python: str = sys.executable) -> list[str]:
    kind, policy = name.split(":")
    urls = [b.url for b in backends]
    sources = [f"{b.url}=tcp://127.0.0.1:{b.pub}" for b in backends]
    replays = [f"{b.url}=tcp://127.0.0.1:{b.replay}" for b in backends]
    if kind == "hybridkv":
        argv = [python, "-m", "hybridkv.tools.cli", "route", "--policy", policy,
                "--port", str(port), "--check-interval", "0.5", "--log-level", "warning"]
        for url, source, replay in zip(urls, sources, replays):
            argv += ["--backend", url, "--kv-event-source", source,
                     "--kv-event-replay-source", replay]
        return argv
    if kind == "vllm-router":
        argv = [os.path.join(venv, "bin", "vllm-router"), "--host", "127.0.0.1", "--port",
                str(port), "--prometheus-port", str(free_port()), "--policy", policy,
                "--worker-urls", *urls]
        if policy == "kv_aware":
            for source, replay in zip(sources, replays):
                argv += ["--kv-event-source", source, "--kv-event-replay-source", replay]
            argv += ["--kv-event-block-size", "16", "--kv-event-model", model]
        return argv
    return [os.path.join(venv, "bin", "python"), "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
            "--policy", policy, "--worker-urls", *urls]


# ---- workload ----------------------------------------------------------------------

@dataclass
class Turn:
    conversation: int
    messages: list[dict]


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    output_tokens: int = 0
    served_by: dict[str, int] = field(default_factory=dict)


def documents(rng: random.Random, n: int, words: int) -> list[str]:
    corpus = sample_text().split()
    out = []
    for _ in range(n):
        start = rng.randrange(0, len(corpus) - words)
        out.append(" ".join(corpus[start:start + words]))
    return out


def question(rng: random.Random, corpus: list[str], words: int) -> str:
    start = rng.randrange(0, len(corpus) - words)
    return " ".join(corpus[start:start + words]) + "?"


def plan(args) -> list[tuple[float, int, list[str]]]:
    """(start time, document, user questions) per conversation, fixed by the seed."""
    rng = random.Random(args.seed)
    corpus = sample_text().split()
    weights = [1 / (k + 1) ** args.zipf for k in range(args.documents)]
    t, out = 0.0, []
    for _ in range(args.conversations):
        t += rng.expovariate(args.rate)
        doc = rng.choices(range(args.documents), weights)[0]
        out.append((t, doc, [question(rng, corpus, args.question_words)
                             for _ in range(args.turns)]))
    return out


async def one_request(client: httpx.AsyncClient, url: str, messages: list[dict], args,
                      result: Result) -> str:
    body = {"model": args.model, "messages": messages, "max_tokens": args.max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, text = None, []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            result.errors.append(f"{reply.status_code}: {(await reply.aread())[:200]!r}")
            return ""
        backend = reply.headers.get("x-hybridkv-backend", "?")
        result.served_by[backend] = result.served_by.get(backend, 0) + 1
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
            usage = chunk.get("usage")
            if usage:
                result.output_tokens += usage.get("completion_tokens", 0)
    if first is None:
        result.errors.append("no content streamed")
        return ""
    result.ttft.append(first - start)
    return "".join(text)


async def conversation(client, url: str, start: float, system: str, questions: list[str],
                       args, result: Result, rng: random.Random, t0: float) -> None:
    await asyncio.sleep(max(0.0, t0 + start - time.perf_counter()))
    messages = [{"role": "system", "content": system}]
    for q in questions:
        messages.append({"role": "user", "content": q})
        try:
            answer = await one_request(client, url, messages, args, result)
        except httpx.HTTPError as err:
            result.errors.append(f"{type(err).__name__}: {err}")
            return
        messages.append({"role": "assistant", "content": answer or "."})
        await asyncio.sleep(rng.expovariate(1 / args.think))


async def run_workload(url: str, args) -> tuple[Result, float]:
    docs = documents(random.Random(args.seed + 1), args.documents, args.document_words)
    result = Result()
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        t0 = time.perf_counter()
        rng = random.Random(args.seed + 2)
        await asyncio.gather(*(conversation(client, url, start, docs[doc], qs, args, result,
                                            random.Random(rng.random()), t0)
                               for start, doc, qs in plan(args)))
        return result, time.perf_counter() - t0


# ---- measurement -------------------------------------------------------------------

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success",
            "vllm:prompt_tokens")


def backend_counters(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in out:
                out[name] += sample.value
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summarize(result: Result, seconds: float, before: list[dict], after: list[dict]) -> dict:
    delta = [{k: a[k] - b[k] for k in COUNTERS} for b, a in zip(before, after)]
    queries = sum(d["vllm:prefix_cache_queries"] for d in delta)
    hits = sum(d["vllm:prefix_cache_hits"] for d in delta)
    requests = [d["vllm:request_success"] for d in delta]
    computed = [d["vllm:prefix_cache_queries"] - d["vllm:prefix_cache_hits"] for d in delta]
    mean_req = sum(requests) / len(requests) if requests else 0
    mean_comp = sum(computed) / len(computed) if computed else 0
    return {"requests": len(result.ttft), "errors": len(result.errors),
            "error_samples": result.errors[:3], "seconds": seconds,
            "hit_rate": hits / queries if queries else 0.0,
            "ttft_p50_s": percentile(result.ttft, 0.5),
            "ttft_p99_s": percentile(result.ttft, 0.99),
            "requests_per_s": len(result.ttft) / seconds,
            "output_tokens_per_s": result.output_tokens / seconds,
            "imbalance_requests": max(requests) / mean_req if mean_req else float("nan"),
            "imbalance_computed_tokens": max(computed) / mean_comp if mean_comp else
            float("nan"),
            "per_backend": delta}


def router_full_collections(url: str) -> float:
    """Full (generation 2) garbage collections `hybridkv route` has run so far."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "python_gc_collections_total" and \
                    sample.labels.get("generation") == "2":
                return sample.value
    return float("nan")


def run_router(name: str, args, log_dir: str) -> dict:
    backends, shim = start_backends(args, log_dir)
    port = free_port()
    tag = name.replace(":", "-")
    argv = router_argv(name, port, backends, args.venv, args.model)
    if name.startswith("hybridkv:") and args.tokenizer_dir:
        argv += ["--tokenizer", args.tokenizer_dir]
    router = Process(argv, os.path.join(log_dir, f"router-{tag}.log"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, router.proc, 120)
        time.sleep(args.settle)  # routers poll workers and subscribe to their events
        before = [backend_counters(b.server_url) for b in backends]
        result, seconds = asyncio.run(run_workload(url, args))
        time.sleep(0.5)
        after = [backend_counters(b.server_url) for b in backends]
        summary = summarize(result, seconds, before, after)
        if name.startswith("hybridkv:"):
            summary["router_full_gc_collections"] = router_full_collections(url)
        summary["fields_dropped_by_shim"] = [httpx.get(f"{b.url}/shim/stats").json()["dropped"]
                                             for b in backends]
        return summary
    except RuntimeError as err:
        return {"failed": f"{err}; see {router.log.name}"}
    finally:
        router.stop()
        shim.stop()
        for b in backends:
            b.process.stop()


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in results.items() if "failed" not in r]
    panels = [("hit_rate", "cluster prefix hit rate"), ("ttft_p50_s", "TTFT p50 (s)"),
              ("ttft_p99_s", "TTFT p99 (s)"), ("requests_per_s", "requests / s"),
              ("imbalance_requests", "load imbalance (max/mean requests)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4.5))
    for ax, (key, title) in zip(axes, panels):
        ax.bar(range(len(names)), [results[n][key] for n in names], color="tab:blue")
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# workload settings: `light` (about 3 requests/s, nothing queues: TTFT is the
# router's path plus a small prefill) and `loaded` (longer documents, faster
# arrivals and more conversations: the backends queue, so where the cache is
# and how the load is spread decide TTFT)
SETTINGS = {
    "light": {"documents": 8, "document_words": 120, "conversations": 24, "rate": 1.5,
              "think": 0.5, "max_tokens": 12},
    "loaded": {"documents": 12, "document_words": 360, "conversations": 40, "rate": 3.0,
               "think": 0.3, "max_tokens": 16},
}
FULL_ATTENTION = "full-attention-tiny"  # --model: a Qwen2 checkpoint written for the run


def resolve_model(args, work_dir: str) -> None:
    """Set `args.model_path` (what the backends load) and `args.tokenizer_dir`
    (`hybridkv route --tokenizer`, or None to tokenize through the backends)."""
    from hybridkv.tools.tokenizer_checkpoint import (
        save_full_attention_checkpoint,
        save_preset_tokenizer,
    )

    if args.model == FULL_ATTENTION:
        args.model_path = str(save_full_attention_checkpoint(os.path.join(work_dir, "ckpt")))
        tokenizer = args.model_path
    else:
        args.model_path = args.model
        tokenizer = str(save_preset_tokenizer(os.path.join(work_dir, "tokenizer"), args.model))
    args.tokenizer_dir = tokenizer if args.router_tokenize == "local" else None


def apply_setting(args) -> None:
    """Workload options left unset take the values of `--setting`."""
    for name, value in SETTINGS[args.setting].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--model", default="gemma3-tiny",
                    help=f"a preset, or {FULL_ATTENTION} (a full-attention Qwen2 checkpoint)")
    ap.add_argument("--backends", type=int, default=3)
    ap.add_argument("--num-blocks", type=int, default=400, help="each backend's pool")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--rotate", type=int, default=0,
                    help="start the router list at this position (vary the order across runs)")
    ap.add_argument("--venv", default="/work/venvs/routers", help="where the peer routers are")
    ap.add_argument("--router-tokenize", choices=("local", "backend"), default="local",
                    help="hybridkv route tokenizes with the model's tokenizer directory "
                         "(--tokenizer, what a deployment does) or through a backend's "
                         "/tokenize")
    ap.add_argument("--setting", choices=tuple(SETTINGS), default="light")
    for name in SETTINGS["light"]:
        kind = float if name in ("rate", "think") else int
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                        help=f"default: the setting's ({SETTINGS['light'][name]} when light, "
                             f"{SETTINGS['loaded'][name]} when loaded)")
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--question-words", type=int, default=12)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    apply_setting(args)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = prepare_out(args.out)
    log_dir = os.path.join(out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    resolve_model(args, out)
    names = args.routers.split(",")
    k = args.rotate % len(names)
    results = {}
    for name in names[k:] + names[:k]:
        print(f"== {name}", flush=True)
        results[name] = run_router(name, args, log_dir)
        print(json.dumps({k: v for k, v in results[name].items() if k != "per_backend"}),
              flush=True)
    tag = f"routers-{args.model}-{args.setting}"
    plot(results, os.path.join(out, f"{tag}.png"))
    report = {"config": vars(args), "load_average": os.getloadavg(), "routers": results}
    print(write_result(tag, report, out))
    return report


if __name__ == "__main__":
    main()
