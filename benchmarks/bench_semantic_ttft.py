"""Time to first token of a semantic-cache hit through a real server.

Starts `hybridkv serve` (a tiny checkpoint with a real tokenizer) with
`--semantic-cache memory://` on 127.0.0.1, stores one answer, then alternates
streamed chat requests: a paraphrase (a hit) and the same paraphrase with
`"semantic_cache": false` (the model). TTFT = from sending the request to
the first `data:` event with content, over keep-alive HTTP; 3 rounds of
`--requests` each after a warm-up, p50 / p99 per round and their medians.

    python benchmarks/bench_semantic_ttft.py [--requests 200] [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
from common import add_common_args, machine, prepare_out, write_result

QUESTION = "What is the capital city of France?"
PARAPHRASE = "What's the capital city of France?"


def start(checkpoint: str, port: int, log) -> subprocess.Popen:
    argv = [sys.executable, "-m", "hybridkv.tools.cli", "serve", checkpoint, "--port", str(port),
            "--threads", "1", "--served-model-name", "tiny", "--semantic-cache", "memory://",
            # the fixed threshold, so the paraphrase is served from its first request on (a
            # learned threshold serves it only after many verifications; a hit costs the same)
            "--semantic-error-bound", "none"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def ttft(client: httpx.Client, text: str, cached: bool) -> tuple[float, str]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "stream": True,
            "temperature": 0, "max_tokens": 8, "semantic_cache": cached}
    start, first = time.perf_counter(), None
    with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        for line in reply.iter_lines():
            if first is None and line.startswith("data: ") and '"content":""' not in line:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no content event")
    return first, reply.headers.get("x-hybridkv-semantic-cache", "absent")


def percentiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"p50_ms": 1e3 * xs[len(xs) // 2], "p99_ms": 1e3 * xs[int(0.99 * (len(xs) - 1))]}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    out_dir = prepare_out(args.out)
    n = 20 if args.quick else args.requests
    from hybridkv.tools.tokenizer_checkpoint import save_checkpoint_with_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = str(save_checkpoint_with_tokenizer(os.path.join(tmp, "ckpt")))
        port = free_port()
        with open(os.path.join(tmp, "server.log"), "w") as log:
            proc = start(checkpoint, port, log)
            try:
                result = measure(f"http://127.0.0.1:{port}", n)
            finally:
                proc.terminate()
                proc.wait(60)
    result.update(machine=machine(), load_average=os.getloadavg())
    print(result)
    print(write_result("bench_semantic_ttft", result, out_dir))


def measure(url: str, n: int) -> dict:
    rounds = []
    with httpx.Client(base_url=url, timeout=60) as client:
        ttft(client, QUESTION, True)  # stores the answer
        for _ in range(10):  # warm-up
            ttft(client, PARAPHRASE, True)
            ttft(client, PARAPHRASE, False)
        for _ in range(3):
            hit, model = [], []
            for _ in range(n):
                seconds, header = ttft(client, PARAPHRASE, True)
                assert header.startswith("hit"), header
                hit.append(seconds)
                model.append(ttft(client, PARAPHRASE, False)[0])
            rounds.append({"hit": percentiles(hit), "model": percentiles(model)})
    return {"rounds": rounds, **{f"{kind}_{q}_median": statistics.median(
        r[kind][q] for r in rounds) for kind in ("hit", "model") for q in ("p50_ms", "p99_ms")}}


if __name__ == "__main__":
    main()
