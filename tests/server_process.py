"""`hybridkv serve` / `hybridkv route` as real processes on 127.0.0.1, for the HTTP tests.

`serve(MODEL, *args, log_dir=...)` and `ServerProcess(["route", ...], log_dir=...)`
start the command on a free port (or `port`) and, unless `wait=False`, return
once `/health` answers 200. Every test directory imports this module (tests/
is on the path through tests/conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from redis_fixture import free_port

START_TIMEOUT = 180.0


class ServerProcess:
    """`hybridkv COMMAND ARGS... --port P` as a subprocess: `url`, `client()`,
    `post`/`get` (with the API key), `metrics()`, `log_text()`, `stop()`."""

    def __init__(self, command: list[str], *, log_dir: Path, port: int | None = None,
                 api_key: str | None = None, wait: bool = True) -> None:
        self.command = command
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_dir / f"{command[0]}-{self.port}.log"
        argv = [sys.executable, "-m", "hybridkv.tools.cli", *command, "--port", str(self.port)]
        if api_key is not None:
            argv += ["--api-key", api_key]
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        """Until `/health` answers 200; RuntimeError (with the log) if the process
        exits first or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.command[0]} exited with {self.proc.returncode}:\n"
                                   f"{self.log_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.command[0]} not healthy in {timeout}s:\n"
                           f"{self.log_text()[-3000:]}")

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.api_key is None else {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kwargs):
        """The official openai client pointed at this process."""
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "unused",
                             max_retries=0, timeout=120, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.post(f"{self.url}{path}", headers=headers, timeout=120, **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, parsed by prometheus-client: `name{k=v,...}` -> value
        (labels sorted, `model_name` left out)."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                                  if k != "model_name")
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """(A `serve` process) poll /metrics until no request runs or waits and no
        block is held; the last metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
                    and m["hybridkv_kv_cache_blocks_held"] == 0)
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the process and wait for it to exit; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def serve(model: str, *args: str, log_dir: Path, threads: int = 1, **kwargs) -> ServerProcess:
    """`hybridkv serve MODEL --threads N ARGS...` (kwargs: port, api_key, wait)."""
    return ServerProcess(["serve", model, "--threads", str(threads), *args], log_dir=log_dir,
                         **kwargs)


def wait_until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    """Poll `predicate` every 50 ms; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
