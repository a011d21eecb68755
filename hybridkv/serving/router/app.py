"""`hybridkv route`: the OpenAI endpoints of its backends, each request sent to one.

A completion or chat request is turned into prompt token ids (a token-id
prompt as it is; text and chat messages through a backend's `POST /tokenize`,
so the router hashes exactly what the backend will), routed by the policy
(`Router.route`, salted by the request's `cache_salt`; with `--kv-store`,
after asking the shared store which of its blocks it holds, `StoreView`), and
forwarded with its headers over the router's own HTTP/1.1 client
(`upstream.py`). Streams pass through as they come (`relay.py`). The response
carries `x-hybridkv-backend: <instance id>` and `Server-Timing`. The HTTP
routes are in `endpoints.py`.

A backend that cannot be reached, or answers 502/503/504, before the
response has started is taken out of rotation and the request is sent to
another one; a non-streamed request is also retried when its backend fails
while computing it (nothing has reached the client yet). Only a stream that
already sent data ends with an error event when its backend dies (counted
as failed in /metrics).

Input the backends would refuse is refused the same way here: a body whose
text cannot be encoded (a lone surrogate) is a 400 naming `body`, a model no
backend serves is a 404 naming `model`, and unknown paths and methods get
OpenAI error bodies. `--backend-api-key` is sent to the backends in place of
the client's own Authorization header.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response

from hybridkv.serving.router.backends import Backends
from hybridkv.serving.router.event_stream import EventStreams
from hybridkv.serving.router.metrics import RouterMetrics
from hybridkv.serving.router.relay import Headers, RelayResponse
from hybridkv.serving.router.routing import Decision, NoBackendError, PromptHashes, Router
from hybridkv.serving.router.store_view import StoreView
from hybridkv.serving.router.upstream import Reply, UpstreamError, UpstreamPool
from hybridkv.serving.router.zmq_source import EventSource, ZmqSources

logger = logging.getLogger("hybridkv.router")
RETRY_STATUSES = (502, 503, 504)
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive",
               "expect", "te", "upgrade", "proxy-connection"}
# a backend's reply headers not relayed (the body is relayed as its bytes came,
# less the chunked framing: its content-encoding stays)
RELAY_DROP = {name.encode() for name in HOP_HEADERS}
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def unencodable(raw: bytes, body: Any) -> str | None:
    """Why `body` (parsed from `raw`) cannot be sent on as UTF-8 JSON, or None."""
    if not SURROGATE_ESCAPE.search(raw):
        return None
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        return f"request body is not valid JSON: {err.reason} in its text"
    return None


def error(status: int, message: str, param: str | None = None, code: str | None = None):
    kind = "invalid_request_error" if status < 500 else "service_unavailable"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status_code=status)


def load_local_tokenizer(path: str) -> Any:
    """The tokenizer (and chat template) in a model directory, used once so that the
    first request pays no one-time cost (template compiling); ValueError if none."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"--tokenizer {path!r}: no tokenizer there ({err})") from None
    local_tokens(tokenizer, {"messages": [{"role": "user", "content": "warm up"}]})
    return tokenizer


def local_tokens(tokenizer: Any, query: dict[str, Any]) -> list[int]:
    """Token ids of a prompt or chat messages as a backend renders them ([] when
    they cannot be rendered: the backend will say why)."""
    try:
        if "messages" in query:
            # rendered, then encoded without special tokens, as the backend does (the
            # template writes those it wants); asking the template to tokenize costs
            # about 0.5 ms more per request here
            text = tokenizer.apply_chat_template(query["messages"], add_generation_prompt=True,
                                                 tokenize=False)
            return list(tokenizer.encode(text, add_special_tokens=False))
        prompt = query.get("prompt")
        return list(tokenizer(prompt).input_ids) if isinstance(prompt, str) else []
    except Exception:  # noqa: BLE001 - bad messages: routed by load, refused by the backend
        return []


def _json_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The client's headers for a JSON body of the router's own."""
    kept = [(k, v) for k, v in headers if k.lower() != "content-type"]
    return [*kept, ("content-type", "application/json")]


def _tokens_of(answer: bytes) -> list[int]:
    """The `tokens` of a `/tokenize` answer ([] if it has none)."""
    try:
        tokens = json.loads(answer).get("tokens")
    except (ValueError, AttributeError):
        return []
    return list(tokens) if isinstance(tokens, list) else []


class Timing:
    """The router's own stages of one request, for its `Server-Timing` header:
    `tokenize` (prompt to token ids), `route` (hashes, store query, decision;
    summed over retries), `backend` (sending until the backend's response
    headers, retries included), in milliseconds."""

    __slots__ = ("last", "stages")

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.stages: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self.last
        self.last = now

    def header(self) -> str:
        return ", ".join(f"{name};dur={seconds * 1e3:.3f}"
                         for name, seconds in self.stages.items())


class _Failed(Exception):
    """The backend failed before the response reached the client: try another."""


class RouterApp:
    """State of one router process: policy, backends, event streams, metrics."""

    def __init__(self, router: Router, backend_urls: list[str], events_url: str | None, *,
                 check_interval: float = 1.0, request_timeout: float = 600.0,
                 kv_store_url: str | None = None, backend_api_key: str | None = None,
                 kv_event_sources: list[EventSource] | None = None,
                 tokenizer_dir: str | None = None) -> None:
        self.router = router
        self.auth = {} if backend_api_key is None else \
            {"Authorization": f"Bearer {backend_api_key}"}
        self.tokenizer = load_local_tokenizer(tokenizer_dir) if tokenizer_dir else None
        self.upstream = UpstreamPool(read_timeout=request_timeout, connect_timeout=2.0)
        self.metrics = RouterMetrics(router)
        self.streams = EventStreams(events_url, router) if events_url else None
        self.store = StoreView(kv_store_url, router) if kv_store_url else None
        self.zmq = ZmqSources(router, kv_event_sources or [])
        self.backends = Backends(backend_urls, router, interval=check_interval,
                                 on_layout=self._joined, zmq_urls=self.zmq.urls,
                                 headers=list(self.auth.items()))
        self.metrics.backends = self.backends
        self.metrics.store = self.store
        self.metrics.streams = self.streams
        self.semantic: Any = None  # hybridkv.semantic.front.SemanticFront (fleet-wide)

    def _joined(self, backend) -> None:
        if backend.zmq_events:
            self.zmq.follow(backend.url, backend.model)
            return
        if self.streams is not None:
            self.streams.follow(backend.instance_id)
        if self.store is not None and self.store.bind(backend.instance_id, backend.layout):
            logger.info("backend %s loads from kv store %s", backend.instance_id,
                        self.store.url)

    # ---- turning a request into token ids ----------------------------------------

    async def prompt_tokens(self, path: str, body: dict[str, Any],
                            headers: list[tuple[str, str]]) -> list[int]:
        """Token ids the backend will see (the first prompt of a batch)."""
        if path.endswith("/chat/completions"):
            return await self._tokenize({"messages": body.get("messages")}, body, headers)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            prompt = prompt[0]  # a batch goes to one backend, routed by its first prompt
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return prompt
        return await self._tokenize({"prompt": prompt}, body, headers)

    async def _tokenize(self, query: dict[str, Any], body: dict[str, Any],
                        headers: list[tuple[str, str]]) -> list[int]:
        """With `--tokenizer` here, else through a healthy backend; [] when none can
        (the request is routed by load)."""
        if self.tokenizer is not None:
            return local_tokens(self.tokenizer, query)
        if body.get("model") is not None:
            query["model"] = body["model"]
        data = json.dumps(query).encode()
        for backend in self.backends.healthy():
            try:
                reply = await self.upstream.request("POST", f"{backend.url}/tokenize",
                                                    _json_headers(headers), data, 10.0)
                answer = await reply.read()
            except UpstreamError:
                continue
            if reply.status == 200:
                return _tokens_of(answer)
            return []  # the backend refuses the input: it will say why to the client
        return []

    # ---- forwarding --------------------------------------------------------------

    async def forward(self, path: str, raw: bytes, raw_headers: Headers) -> Response:
        """The backend's response to the POST of `raw` to `path` (or the router's own
        error), on the backend the policy picks; retried elsewhere while nothing has
        reached the client."""
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "the request body is not JSON", "body")
        if not isinstance(body, dict):
            return error(400, "the request body must be a JSON object", "body")
        problem = unencodable(raw, body)
        if problem is not None:
            return error(400, problem, "body")
        headers = self.backend_headers(raw_headers)
        timing = Timing()
        tokens = await self.prompt_tokens(path, body, headers)
        timing.lap("tokenize")
        salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
        prompt = PromptHashes(tokens, salt) if tokens else None
        stored = await self.store.stored(prompt) if self.store and prompt else None
        tried: set[str] = set()
        while True:
            try:
                decision = self._route(tokens, salt, body.get("model"), tried, prompt, stored)
            except NoBackendError as err:
                unknown = self._unknown_model(body.get("model"))
                return unknown if unknown is not None else \
                    error(503, str(err), code="no_backend")
            timing.lap("route")
            tried.add(decision.instance_id)
            try:
                return await self._send(decision, path, raw, headers, bool(body.get("stream")),
                                        timing)
            except _Failed as err:
                self.router.finished(decision)
                self.metrics.retries.inc()
                self.backends.mark_down(self.backends.by_instance(decision.instance_id),
                                        str(err))
            except asyncio.CancelledError:  # the client left
                self.router.finished(decision)
                raise

    def backend_headers(self, raw_headers: Headers) -> list[tuple[str, str]]:
        """The client's headers to send on (with `--backend-api-key`, its own key)."""
        drop = HOP_HEADERS | ({"authorization"} if self.auth else set())
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers]
        return [(k, v) for k, v in headers if k.lower() not in drop] + list(self.auth.items())

    def _unknown_model(self, model: object) -> Response | None:
        """The backends' 404 when no backend, healthy or not, serves `model`."""
        served = {b.model for b in self.backends.by_url.values() if b.model is not None}
        if not isinstance(model, str) or not served or model in served:
            return None
        return error(404, f"the model {model!r} does not exist; the backends serve "
                          f"{', '.join(map(repr, sorted(served)))}", "model", "model_not_found")

    def _route(self, tokens: list[int], salt: str | None, model: object, tried: set[str],
               prompt: PromptHashes | None, stored) -> Decision:
        model = model if isinstance(model, str) else None
        if tokens:
            decision = self.router.route(tokens, cache_salt=salt, model=model, exclude=tried,
                                         hashes=prompt, stored=stored)
        else:  # no token ids (the backends could not tokenize): by load
            decision = self.router.route([0], model=model, exclude=tried)
        self.metrics.routed(decision)
        return decision

    async def _send(self, decision: Decision, path: str, raw: bytes,
                    headers: list[tuple[str, str]], stream: bool, timing: Timing) -> Response:
        url = self.backends.by_instance(decision.instance_id).url + path
        try:
            reply = await self.upstream.request("POST", url, headers, raw)
        except UpstreamError as err:
            raise _Failed(str(err)) from None
        if reply.status in RETRY_STATUSES:
            reply.close()
            raise _Failed(f"answered {reply.status}")
        timing.lap("backend")
        out_headers = [(k, v) for k, v in reply.headers if k not in RELAY_DROP]
        out_headers += [(b"x-hybridkv-backend", decision.instance_id.encode("latin-1")),
                        (b"server-timing", timing.header().encode())]
        if stream and reply.status == 200:
            return RelayResponse(self._relay(decision, reply), 200, out_headers,
                                 lambda: self._relayed(decision, reply))
        try:
            content = await reply.read()
        except UpstreamError as err:
            raise _Failed(str(err)) from None
        finally:
            reply.close()
        self.router.finished(decision)
        self.metrics.answered(decision, reply.status)
        response = Response(content, status_code=reply.status)
        response.raw_headers += out_headers
        return response

    async def _relay(self, decision: Decision, reply: Reply) -> AsyncIterator[bytes]:
        try:
            async for chunk in reply.chunks():
                self.router.first_token(decision)
                yield chunk
        except UpstreamError as err:
            logger.warning("backend %s failed mid-stream: %s", decision.instance_id, err)
            self.backends.mark_down(self.backends.by_instance(decision.instance_id), str(err))
            self.router.finished(decision)
            self.metrics.stream_failed(decision)
            message = {"error": {"message": f"backend {decision.instance_id} failed "
                                 "mid-stream", "type": "service_unavailable", "param": None,
                                 "code": "backend_failed"}}
            yield f"data: {json.dumps(message)}\n\n".encode()

    def _relayed(self, decision: Decision, reply: Reply) -> None:
        """A relayed stream ended (done, failed, or the client left)."""
        reply.close()
        if not decision.done:  # a failed stream was counted when it failed
            self.router.finished(decision)
            self.metrics.answered(decision, reply.status)
