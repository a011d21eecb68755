"""A real redis-server on a free loopback port for the store tests.

Fails (never skips silently) when redis-server is missing, unless
HYBRIDKV_SKIP_REDIS=1 is set.
"""

import subprocess

import pytest
from redis_fixture import _wait_for_ping, free_port, redis_server_exe


class RedisServer:
    """A redis-server subprocess on 127.0.0.1 (no persistence) that a test may stop.

    Built on the shared helpers of tests/redis_fixture.py; the store tests need the
    server object (its port, a client, `stop`), not only its URL.
    """

    def __init__(self, *extra: str) -> None:
        binary = redis_server_exe()
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for_ping(self.url, self.proc)
        except RuntimeError as error:
            self.stop()
            pytest.fail(str(error))

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
