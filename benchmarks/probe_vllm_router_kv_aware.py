"""Does vllm-router's `kv_aware` policy consume hybridkv's vLLM-format events?

Three `hybridkv serve --kv-events-config` backends (behind `field_shim.py`,
as in bench_routers.py) and vllm-router `--policy kv_aware` with their event
sources, at debug log level. Three 300-token token-id documents, each sent
three times with a different last token, then chat messages (text, which
vllm-router must tokenize itself). Prints, per request, the backend's
cached tokens, and the router's own "KV prefix decision" log lines (the
prefix tokens it credited from the events).

    PYTHONPATH=. python benchmarks/probe_vllm_router_kv_aware.py --out /tmp/probe-kv-aware
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from types import SimpleNamespace

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_routers as br  # noqa: E402


def decisions(log_path: str) -> list[str]:
    text = re.sub(r"\x1b\[[0-9;]*m", "", open(log_path).read())
    return [line.split("KV prefix decision ", 1)[1] for line in text.splitlines()
            if "KV prefix decision" in line]


def send_all(url: str) -> list[str]:
    out = []
    for rep in range(3):
        for d in range(3):
            prompt = [(d * 37 + i) % 400 + 3 for i in range(300)] + [rep + 3]
            reply = httpx.post(url + "/v1/completions", timeout=120, json={
                "model": "gemma3-tiny", "prompt": prompt, "max_tokens": 2}).json()
            out.append(f"token ids doc {d} rep {rep}: cached "
                       f"{reply['usage']['prompt_tokens_details']['cached_tokens']}")
            time.sleep(0.5)
    for rep in range(2):
        reply = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "gemma3-tiny", "max_tokens": 2,
            "messages": [{"role": "system", "content": "word " * 200},
                         {"role": "user", "content": f"question {rep}"}]}).json()
        out.append(f"chat rep {rep}: cached "
                   f"{reply['usage']['prompt_tokens_details']['cached_tokens']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--venv", default="/work/venvs/routers")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    backends, shim = br.start_backends(SimpleNamespace(
        backends=3, model="gemma3-tiny", model_path="gemma3-tiny", num_blocks=400,
        backend_engine="hybridkv"), args.out)
    port = br.free_port()
    argv = br.router_argv("vllm-router:kv_aware", port, backends, args.venv, "gemma3-tiny")
    log_path = os.path.join(args.out, "vllm-router.log")
    router = br.Process([*argv, "--log-level", "debug"], log_path)
    try:
        br.wait_health(f"http://127.0.0.1:{port}", router.proc, 120)
        time.sleep(2)
        for line in send_all(f"http://127.0.0.1:{port}"):
            print(line)
        for b in backends:
            print(b.url, br.backend_counters(b.server_url))
    finally:
        router.stop()
        br.stop_backends(backends, shim)
    for line in decisions(log_path):
        print("vllm-router:", line)


if __name__ == "__main__":
    main()
