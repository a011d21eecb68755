"""Record a real vLLM server's `/metrics` page with the usage of the requests behind it.

Starts one vLLM backend exactly as `bench_routers.py --backend-engine vllm` does
(`router_backends.vllm_command`: gemma3-tiny-hs32, block size 16 asked, one OpenMP
thread, KV memory by `--kv-cache-memory-bytes`), sends chat requests (a document
three times with different questions, then an unrelated short one), and writes the
`/metrics` text, every response's `usage` and the KV bytes asked for as JSON, for the
tests of `router_backends.counters_from_text` / `cache_config`.

    PYTHONPATH=. python benchmarks/capture_vllm_metrics.py \\
        --vllm-python /work/venvs/vllm/bin/python --out tests/data/vllm_metrics.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from types import SimpleNamespace

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router_backends import Process, free_port, vllm_command, wait_health  # noqa: E402
from serve_checkpoints import write_checkpoint  # noqa: E402

MODEL = "gemma3-tiny-hs32"
KV_BYTES = 4 << 20
DOCUMENT = ("a sliding window keeps the recent tokens while the global layers see every "
            "token of the prompt so a cache must hold both kinds of block ") * 3
QUESTIONS = ["what does the window keep?", "which layers see every token?",
             "why hold both kinds?"]


def send(url: str, messages: list[dict]) -> dict:
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0})
    reply.raise_for_status()
    return reply.json()["usage"]


def capture(url: str) -> tuple[list[dict], str]:
    usage = [send(url, [{"role": "system", "content": DOCUMENT},
                        {"role": "user", "content": q}]) for q in QUESTIONS]
    usage.append(send(url, [{"role": "user", "content": "hello there"}]))
    return usage, httpx.get(f"{url}/metrics", timeout=30).text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hybridkv-metrics-")
    config = SimpleNamespace(vllm_python=args.vllm_python, model=MODEL, vllm_block_size=16,
                             model_path=write_checkpoint(MODEL, work), kv_bytes=KV_BYTES)
    port, pub, replay = free_port(), free_port(), free_port()
    argv, env = vllm_command(config, port, pub, replay)
    server = Process(argv, os.path.join(work, "vllm.log"), env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, server.proc, 900)
        usage, metrics = capture(url)
    finally:
        server.stop()
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "kv_bytes": KV_BYTES,
                   "usage": usage, "metrics": metrics}, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(usage)} requests")


if __name__ == "__main__":
    main()
