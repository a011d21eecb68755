"""A real redis-server for tests: `redis_server` (session scope) yields its URL.

Started on a free 127.0.0.1 port with persistence off and stopped after the
session. Tests that use it must not silently skip: without redis-server the
fixture fails with a clear message, unless HYBRIDKV_SKIP_REDIS=1.
"""

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_ping(url: str, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with status {proc.returncode}")
        try:
            if client.ping():
                client.close()
                return
        except (redis.RedisError, OSError):
            time.sleep(0.05)
    raise RuntimeError(f"redis-server at {url} did not answer PING within {timeout}s")


def redis_server_exe() -> str:
    """Path of redis-server; fails the test (or skips with HYBRIDKV_SKIP_REDIS=1) without it."""
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("HYBRIDKV_SKIP_REDIS") == "1":
            pytest.skip("redis-server not installed and HYBRIDKV_SKIP_REDIS=1")
        pytest.fail("redis-server is not installed (Debian: apt-get install redis-server); "
                    "set HYBRIDKV_SKIP_REDIS=1 to skip the tests that need it")
    return exe


@contextlib.contextmanager
def running_redis(workdir: Path, port: int | None = None):
    """A redis-server on 127.0.0.1:`port` (free by default) until the block ends; its URL."""
    exe = redis_server_exe()
    port = free_port() if port is None else port
    log = open(workdir / f"redis-{port}.log", "w")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_for_ping(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


class RedisProcess:
    """A redis-server on a fixed free 127.0.0.1 port (no persistence) that a test
    can `kill` (SIGKILL) and `start` again on the same port; `url`."""

    def __init__(self, workdir: Path) -> None:
        self.port, self.workdir = free_port(), workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [redis_server_exe(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_ping(self.url, self.proc)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def killable_redis(tmp_path):
    """A started `RedisProcess` for one test (which may kill and restart it)."""
    server = RedisProcess(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """URL (`redis://127.0.0.1:PORT/0`) of a redis-server running for this session."""
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url
