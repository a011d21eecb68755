"""`hybridkv serve` backends and `hybridkv route` routers as real processes on 127.0.0.1."""

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


class Proc:
    """`hybridkv COMMAND ARGS... --port P` as a subprocess, healthy before it returns."""

    def __init__(self, command: list[str], log_dir: Path, port: int | None = None,
                 wait: bool = True) -> None:
        self.command = command
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{command[0]}-{self.port}.log"
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridkv.tools.cli", *command, "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
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
        raise RuntimeError(f"{self.command[0]} not healthy in {timeout}s:\n"
                           f"{self.log_text()[-3000:]}")

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                             timeout=120)

    def metrics(self) -> dict[str, float]:
        """`name{label=value,...}` -> value, parsed by prometheus-client."""
        out = {}
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                                  if k != "model_name")
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def serve(model: str, instance_id: str, events: str, log_dir: Path, *args: str,
          port: int | None = None, wait: bool = True) -> Proc:
    return Proc(["serve", model, "--instance-id", instance_id, "--events", events,
                 "--threads", "1", *args], log_dir, port, wait)


def route(backends: list[Proc], events: str, log_dir: Path, policy: str) -> Proc:
    args = ["route", "--policy", policy, "--events", events, "--check-interval", "0.3"]
    for backend in backends:
        args += ["--backend", backend.url]
    return Proc(args, log_dir)


def complete(router: Proc, prompt: list[int], **kwargs) -> tuple[str, int]:
    """Send a token-id completion through `router`: (backend that served it, cached tokens)."""
    raw = router.client().completions.with_raw_response.create(
        model="gemma3-tiny", prompt=prompt, max_tokens=kwargs.pop("max_tokens", 1),
        temperature=0, **kwargs)
    body = raw.parse()
    return raw.headers["x-hybridkv-backend"], body.usage.prompt_tokens_details.cached_tokens


def wait_until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
