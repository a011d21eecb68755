"""Start, probe and stop the two servers of `bench_vs_vllm_serve.py` (127.0.0.1 only).

Each configuration gets a fresh server process, whose output goes to a log file
in the results folder. Prefix-cache counters are read from each server's
Prometheus `/metrics` (`vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`, the
same names in both).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, replace

from router_backends import Process, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# (checkpoint, block size) -> bytes of one vLLM block, read from its start-up log
_VLLM_BLOCK_BYTES: dict[tuple[str, int], int] = {}


@dataclass(frozen=True)
class ServerConfig:
    """One server to start: which engine, its block size and KV blocks, its mode."""

    engine: str  # "hybridkv" | "hybridkv-unbound" | "hybridkv-thread" | "vllm" | "vllm-eager",
    # or "hybridkv-all-cores" | "vllm-all-cores" (compute threads on every core)
    checkpoint: str
    block_size: int
    num_blocks: int
    kv_bytes: int
    threads: int
    max_num_seqs: int = 32
    cpu_bind: str = "none"  # hybridkv's --cpu-bind (vLLM's CPU worker binds itself)


def is_hybridkv(engine: str) -> bool:
    """Whether `engine` names a hybridkv server (a name starting "hybridkv")."""
    return engine.startswith("hybridkv")


def all_cores(engine: str) -> bool:
    """Whether `engine` computes on every core of the machine (the `-all-cores` variants:
    hybridkv unbound with one thread per core; vLLM's CPU worker bound to every core
    instead of keeping one for its scheduler)."""
    return engine.endswith("-all-cores")


def max_model_len(checkpoint: str, cap: int = 4096) -> int:
    """`cap`, or less where the checkpoint's positions end sooner (vLLM refuses more)."""
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
    return min(cap, int(config.get("max_position_embeddings") or cap))


def server_command(config: ServerConfig, port: int, vllm_python: str) -> tuple[list[str], dict]:
    """The command line and environment of `config` on `port`."""
    env = dict(os.environ)
    if is_hybridkv(config.engine):
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "hybridkv.tools.cli", "serve", config.checkpoint,
               "--port", str(port), "--block-size", str(config.block_size),
               "--kv-cache-bytes", str(config.kv_bytes), "--threads", str(config.threads),
               "--max-num-seqs", str(config.max_num_seqs), "--log-level", "warning",
               "--cpu-bind", config.cpu_bind]
        if config.engine == "hybridkv-thread":  # the engine on a thread of the server
            cmd.append("--no-engine-process")
        return cmd, env
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("PYTHONPATH", None)
    cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", config.checkpoint,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--block-size", str(config.block_size),
           "--num-gpu-blocks-override", str(config.num_blocks), "--enable-prefix-caching",
           "--max-num-seqs", str(config.max_num_seqs),
           "--max-model-len", str(max_model_len(config.checkpoint)),
           "--uvicorn-log-level", "warning"]
    if config.engine == "vllm-eager":
        cmd.append("--enforce-eager")
    if all_cores(config.engine):
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{config.threads - 1}"
    return cmd, env


class Server:
    """A running server; `stop()` ends it (SIGINT, then SIGKILL after 20 s)."""

    def __init__(self, config: ServerConfig, vllm_python: str, log_path: str,
                 timeout: float = 600.0) -> None:
        self.config = config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd, env = server_command(config, self.port, vllm_python)
        self.process = Process(cmd, log_path, env, stop_signal=signal.SIGINT)
        self.proc = self.process.proc
        self._wait_ready(timeout, log_path)

    def _wait_ready(self, timeout: float, log_path: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.config.engine} server exited with "
                                   f"{self.proc.returncode}; see {log_path}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"{self.config.engine} server not ready in {timeout:.0f} s; "
                           f"see {log_path}")

    def prefix_counters(self) -> tuple[float, float]:
        """(queries, hits) in tokens from `/metrics`, summed over label sets."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        return _counter(text, "vllm:prefix_cache_queries"), _counter(text, "vllm:prefix_cache_hits")

    def stop(self) -> None:
        self.process.stop()


def _counter(text: str, name: str) -> float:
    """Sum of the samples of counter `name` (`name_total` or `name`) in Prometheus text."""
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:{{[^}}]*}})? ([0-9.eE+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def start_server(config: ServerConfig, vllm_python: str, log_path: str) -> Server:
    """A fresh server of `config`; for vLLM, with the block count that buys `kv_bytes`.

    vLLM may pad pages or raise the block size of a hybrid model, so its bytes per block
    are read from its own start-up log (the blocks its 1 GiB KV space buys, before the
    override) the first time a (checkpoint, block size) starts; a server started with a
    different count is stopped and started again with the right one.
    """
    key = (config.checkpoint, config.block_size)
    if not is_hybridkv(config.engine) and key in _VLLM_BLOCK_BYTES:
        config = replace(config, num_blocks=max(2, config.kv_bytes // _VLLM_BLOCK_BYTES[key]))
    server = Server(config, vllm_python, log_path)
    if is_hybridkv(config.engine) or key in _VLLM_BLOCK_BYTES:
        return server
    with open(log_path) as f:
        found = re.search(r"Overriding num_gpu_blocks=(\d+)", f.read())
    if found is None:
        return server
    _VLLM_BLOCK_BYTES[key] = (1 << 30) // int(found.group(1))
    right = max(2, config.kv_bytes // _VLLM_BLOCK_BYTES[key])
    if right == config.num_blocks:
        return server
    server.stop()
    return Server(replace(config, num_blocks=right), vllm_python, log_path)
