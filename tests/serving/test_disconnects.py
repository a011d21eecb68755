"""Clients that hang up, queued requests included: the server keeps serving,
finishes every request it kept, and holds no KV block afterwards."""

import asyncio
import socket
import time

import pytest
from server_process import serve

from hybridkv.tools.disconnects import problems, rss_bytes, run_round

MODEL = "gemma3-tiny"


@pytest.fixture(scope="module")
def small_server(server_logs):
    """Two running sequences at most, so most of a burst waits in the queue."""
    server = serve(MODEL, "--max-num-seqs", "2", "--max-queue", "64", log_dir=server_logs)
    yield server
    assert server.stop() == 0


def _raw_request(server, body: bytes) -> socket.socket:
    """Send a POST on a raw socket (closed later by the test, without reading)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    sock.sendall(head.encode() + body)
    return sock


def _wait(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_a_queued_request_whose_client_leaves_is_dropped(small_server):
    server = small_server
    long = (b'{"prompt": [3, 4, 5, 6], "max_tokens": 400, "ignore_eos": true, '
            b'"stream": true}')
    runners = [_raw_request(server, long) for _ in range(2)]  # both seats taken
    _wait(lambda: server.metrics()["vllm:num_requests_running"] == 2)
    queued = _raw_request(server, b'{"prompt": [9, 9, 9], "max_tokens": 5, "stream": true}')
    _wait(lambda: server.metrics()["vllm:num_requests_waiting"] == 1)
    queued.close()  # the client gives up while its request waits
    _wait(lambda: server.metrics()["vllm:num_requests_waiting"] == 0)
    for sock in runners:
        sock.close()
    m = server.wait_idle()
    assert m["hybridkv_kv_cache_blocks_held"] == 0
    assert server.get("/health").status_code == 200
    out = server.client().completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=3,
                                             temperature=0)
    assert out.usage.completion_tokens == 3


def test_bursts_with_random_hang_ups_leave_nothing_behind(small_server):
    server = small_server
    rss = []
    for seed in range(3):
        outcomes = asyncio.run(run_round(server.url, model=MODEL, num_clients=16,
                                         max_tokens=6, seed=seed))
        assert problems(outcomes, 6) == []
        assert sum(o.hung_up for o in outcomes) == 4
        m = server.wait_idle()
        assert m["hybridkv_kv_cache_blocks_held"] == 0
        assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        rss.append(rss_bytes(server.proc.pid))
    assert server.get("/health").status_code == 200
    assert rss[-1] - rss[0] < 64 << 20, f"resident memory grew across rounds: {rss}"
