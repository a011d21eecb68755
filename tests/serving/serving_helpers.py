"""Real `hybridkv serve` processes on 127.0.0.1 for the serving tests."""

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
    """`hybridkv serve MODEL ARGS...` as a subprocess; `url`, `log_text()`, `stop()`."""

    def __init__(self, model: str, *args: str, log_dir: Path, api_key: str | None = None,
                 threads: int = 1) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_dir / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "hybridkv.tools.cli", "serve", model, "--port",
               str(self.port), "--threads", str(threads), *args]
        if api_key is not None:
            cmd += ["--api-key", api_key]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n"
                                   f"{self.log_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not healthy within {START_TIMEOUT}s:\n{self.log_text()}")

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.api_key is None else {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kwargs):
        """The official openai client pointed at this server."""
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
        """Every sample of /metrics, parsed by prometheus-client: `name{labels}` -> value."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                                  if k != "model_name")
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Poll /metrics until no request runs or waits and no block is held."""
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
        """Signal the server and wait for it to exit; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode
