"""`hybridkv route` in front of a scripted backend (the standard library's HTTP
server, no model): what the backend writes reaches the client unchanged, a
client that leaves closes the backend's connection, a backend that breaks off
ends the stream with an error event, an error status comes back with its body.
The official openai client reads through the router."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest
from http_helpers import ServerProcess, wait_until

from hybridkv.kv_cache.specs import FullAttentionSpec
from hybridkv.serving.router.layout import CacheLayout

MODEL = "scripted"
WORDS = ["Hello", ",", " world", "!"]


def chat_events(n: int) -> list[bytes]:
    return [b"data: " + json.dumps({
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": WORDS[i % len(WORDS)]},
                     "finish_reason": None}]}).encode() + b"\n\n" for i in range(n)]


class Scripted(BaseHTTPRequestHandler):
    """GETs and `/tokenize` as a router needs; POST /v1/chat/completions as the
    body's `user` says:
    `chunked`, `length` (one content-length body), `endless` (an event every 50 ms
    until the connection breaks), `cut` (two events, then the connection closes),
    `refuse` (a 400 with an OpenAI error body)."""

    protocol_version = "HTTP/1.1"
    broken: list[float] = []  # when an endless stream found its connection closed
    ports: list[int] = []  # the router's port of each POST's connection

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        layout = {"instance_id": "S", "model": MODEL,
                  **CacheLayout((FullAttentionSpec(16),)).to_json()}
        body = {"/health": b"", "/metrics": b"vllm:num_requests_running 0\n",
                "/v1/kv_cache_layout": json.dumps(layout).encode()}.get(self.path)
        self._send(200 if body is not None else 404, body or b"")

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/tokenize":  # the router's, for chat: any ids will do
            return self._send(200, b'{"tokens": [5, 6, 7]}')
        Scripted.ports.append(self.client_address[1])
        mode = request.get("user")
        if mode == "refuse":
            error = {"error": {"message": "max_tokens must be at least 1",
                               "type": "invalid_request_error", "param": "max_tokens",
                               "code": None}}
            return self._send(400, json.dumps(error).encode())
        if mode == "length":
            return self._send(200, b"".join(chat_events(4)) + b"data: [DONE]\n\n",
                              "text/event-stream")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        events = {"chunked": chat_events(4) + [b"data: [DONE]\n\n"], "cut": chat_events(2),
                  "endless": chat_events(10_000)}[mode]
        try:
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(0.05 if mode == "endless" else 0.005)
            if mode == "chunked":
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            Scripted.broken.append(time.monotonic())
        self.close_connection = mode != "chunked"

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    backend = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    backend.daemon_threads = True
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{backend.server_address[1]}"
    proc = ServerProcess(["route", "--policy", "round-robin", "--check-interval", "0.3",
                          "--backend", url], log_dir=tmp_path_factory.mktemp("relay-logs"))
    yield proc
    proc.stop()
    backend.shutdown()


def chat(router: ServerProcess, mode: str, **kwargs):
    return router.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], user=mode, **kwargs)


@pytest.mark.parametrize("mode", ["chunked", "length"])
def test_streamed_events_arrive_unchanged(router, mode):
    chunks = list(chat(router, mode, stream=True))
    assert "".join(c.choices[0].delta.content for c in chunks) == "".join(WORDS)
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [], "user": mode, "stream": True}) as reply:
        assert reply.headers["x-hybridkv-backend"] == "S"
        assert "backend;dur=" in reply.headers["server-timing"]
        body = reply.read()
    assert body == b"".join(chat_events(4)) + b"data: [DONE]\n\n"


def test_requests_in_turn_share_one_backend_connection(router):
    for mode in ("chunked", "length", "chunked", "refuse", "chunked"):
        httpx.post(f"{router.url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [], "user": mode, "stream": mode != "refuse"})
    assert len(set(Scripted.ports[-5:])) == 1, Scripted.ports


def test_an_error_status_comes_back_with_its_body(router):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(router, "refuse")
    assert caught.value.status_code == 400
    assert caught.value.body["message"] == "max_tokens must be at least 1"
    assert caught.value.body["param"] == "max_tokens"


def test_a_client_that_leaves_closes_the_backend_connection(router):
    before = len(Scripted.broken)
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [], "user": "endless", "stream": True}) as reply:
        next(reply.iter_raw())
        left = time.monotonic()
    wait_until(lambda: len(Scripted.broken) > before, what="the backend connection closed")
    assert Scripted.broken[-1] - left < 2.0
    wait_until(lambda: router.metrics()["hybridkv_router_in_flight{backend=S}"] == 0,
               what="no request in flight")


def test_a_backend_that_breaks_off_ends_the_stream_with_an_error_event(router):
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [], "user": "cut", "stream": True}) as reply:
        body = reply.read()
    assert body.startswith(b"".join(chat_events(2)))
    error = json.loads(body[len(b"".join(chat_events(2))):].removeprefix(b"data: "))
    assert error["error"]["code"] == "backend_failed"
    assert router.metrics()["hybridkv_router_stream_failures_total{backend=S}"] == 1
