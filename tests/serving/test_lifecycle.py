"""A full queue answers 429 with Retry-After; SIGTERM drains in-flight requests, then exits 0."""

import signal
import threading
import time

import httpx
import pytest
from server_process import serve

MODEL = "gemma3-tiny"


def _long_stream(server, max_tokens, started: threading.Event, result: dict):
    """Stream a long completion in a thread; record its token count and finish reason."""
    body = {"model": MODEL, "prompt": [3, 4, 5, 6, 7], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    tokens, finish = 0, None
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                started.set()
                chunk = httpx.Response(200, content=line[6:]).json()
                for choice in chunk["choices"]:
                    tokens += 1
                    finish = choice["finish_reason"] or finish
            elif line == "data: [DONE]":
                result["done"] = True
    result.update(tokens=tokens, finish=finish)


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.fixture
def one_seat_server(server_logs):
    """One running sequence, one waiting: the third concurrent request is refused."""
    server = serve(MODEL, "--max-num-seqs", "1", "--max-queue", "1", log_dir=server_logs)
    yield server
    server.stop()


def test_full_queue_answers_429_with_retry_after(one_seat_server):
    server = one_seat_server
    started, first = threading.Event(), {}
    runner = threading.Thread(target=_long_stream, args=(server, 300, started, first))
    runner.start()
    assert started.wait(60)
    second = {}
    waiter = threading.Thread(target=lambda: second.update(server.post(
        "/v1/completions", json={"prompt": [9, 10], "max_tokens": 3}).json()))
    waiter.start()
    _wait_for(lambda: server.metrics()["vllm:num_requests_waiting"] == 1)
    refused = server.post("/v1/completions", json={"prompt": [11, 12], "max_tokens": 3})
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    runner.join(120)
    waiter.join(120)
    assert first["tokens"] == 300 and second["usage"]["completion_tokens"] == 3
    assert server.metrics()["hybridkv_requests_rejected_total"] == 1
    ok = server.post("/v1/completions", json={"prompt": [11, 12], "max_tokens": 3})
    assert ok.status_code == 200


def test_sigterm_drains_in_flight_requests_then_exits_0(server_logs):
    server = serve(MODEL, log_dir=server_logs)
    started, streamed, plain = threading.Event(), {}, {}
    runner = threading.Thread(target=_long_stream, args=(server, 400, started, streamed))
    runner.start()
    poster = threading.Thread(target=lambda: plain.update(server.post(
        "/v1/completions", json={"prompt": [8, 9, 10], "max_tokens": 200,
                                 "ignore_eos": True}).json()))
    poster.start()
    assert started.wait(60)
    _wait_for(lambda: server.metrics()["vllm:num_requests_running"] == 2)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(httpx.ConnectError):  # no new connections while draining
        httpx.get(f"{server.url}/health", timeout=5)
    runner.join(120)
    poster.join(120)
    assert streamed == {"done": True, "tokens": 400, "finish": "length"}
    assert plain["usage"]["completion_tokens"] == 200
    assert plain["choices"][0]["finish_reason"] == "length"
    assert server.proc.wait(60) == 0
    server.stop()
