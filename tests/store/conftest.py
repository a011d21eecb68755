"""A real redis-server on a free loopback port for the store tests.

Fails (never skips silently) when redis-server is missing, unless
HYBRIDKV_SKIP_REDIS=1 is set.
"""

import os
import shutil
import socket
import subprocess
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server subprocess on 127.0.0.1 (no persistence)."""

    def __init__(self, *extra: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            if os.environ.get("HYBRIDKV_SKIP_REDIS") == "1":
                pytest.skip("redis-server is not installed (HYBRIDKV_SKIP_REDIS=1)")
            pytest.fail("redis-server is not installed: apt-get install redis-server "
                        "(or set HYBRIDKV_SKIP_REDIS=1 to skip the Redis tests)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 10.0) -> None:
        import redis

        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited with code {self.proc.returncode}")
            try:
                if client.ping():
                    client.close()
                    return
            except redis.exceptions.RedisError:
                time.sleep(0.05)
        self.stop()
        pytest.fail(f"redis-server on port {self.port} did not answer PING")

    def client(self):
        import redis

        return redis.Redis(port=self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """The session's server, emptied for each test."""
    client = redis_server.client()
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def own_redis():
    """A server of its own (for tests that stop it)."""
    server = RedisServer()
    yield server
    server.stop()
