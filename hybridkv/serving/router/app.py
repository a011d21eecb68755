"""`hybridkv route`: the OpenAI endpoints of its backends, each request sent to one.

A completion or chat request is turned into prompt token ids (a token-id
prompt as it is; text and chat messages through a backend's `POST /tokenize`,
so the router hashes exactly what the backend will), routed by the policy
(`Router.route`, salted by the request's `cache_salt`; with `--kv-store`,
after asking the shared store which of its blocks it holds, `StoreView`), and
forwarded with its headers. Streams pass through as they come. The response carries
`x-hybridkv-backend: <instance id>`. `POST /route/explain` takes the same
body and answers what the policy would decide, sending nothing (per backend:
reusable tokens, cached full-attention chain, health and load).

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
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from hybridkv.serving.errors import install_error_handlers
from hybridkv.serving.router.backends import Backends
from hybridkv.serving.router.event_stream import EventStreams
from hybridkv.serving.router.metrics import RouterMetrics
from hybridkv.serving.router.routing import Decision, NoBackendError, PromptHashes, Router
from hybridkv.serving.router.store_view import StoreView
from hybridkv.serving.router.zmq_source import EventSource, ZmqSources

logger = logging.getLogger("hybridkv.router")
RETRY_STATUSES = (502, 503, 504)
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
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
            ids = tokenizer.apply_chat_template(query["messages"], add_generation_prompt=True,
                                                tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            return [int(t) for t in ids]
        prompt = query.get("prompt")
        return list(tokenizer(prompt).input_ids) if isinstance(prompt, str) else []
    except Exception:  # noqa: BLE001 - bad messages: routed by load, refused by the backend
        return []


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
        # every connection stays open for reuse (httpx keeps 20 by default: past 20
        # concurrent streams each new request would connect again)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(request_timeout, connect=2.0),
                                        limits=httpx.Limits(max_connections=1000,
                                                            max_keepalive_connections=1000),
                                        headers=self.auth)
        self.metrics = RouterMetrics(router)
        self.streams = EventStreams(events_url, router) if events_url else None
        self.store = StoreView(kv_store_url, router) if kv_store_url else None
        self.zmq = ZmqSources(router, kv_event_sources or [])
        self.backends = Backends(backend_urls, router, self.client, interval=check_interval,
                                 on_layout=self._joined, zmq_urls=self.zmq.urls)
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
                            headers: dict[str, str]) -> list[int]:
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
                        headers: dict[str, str]) -> list[int]:
        """With `--tokenizer` here, else through a healthy backend; [] when none can
        (the request is routed by load)."""
        if self.tokenizer is not None:
            return local_tokens(self.tokenizer, query)
        if body.get("model") is not None:
            query["model"] = body["model"]
        for backend in self.backends.healthy():
            try:
                reply = await self.client.post(f"{backend.url}/tokenize", json=query,
                                               headers=headers, timeout=10.0)
            except httpx.HTTPError:
                continue
            if reply.status_code == 200:
                return list(reply.json().get("tokens") or [])
            return []  # the backend refuses the input: it will say why to the client
        return []

    # ---- forwarding --------------------------------------------------------------

    async def forward(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "the request body is not JSON", "body")
        if not isinstance(body, dict):
            return error(400, "the request body must be a JSON object", "body")
        problem = unencodable(raw, body)
        if problem is not None:
            return error(400, problem, "body")
        headers = self.backend_headers(request)
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

    def backend_headers(self, request: Request) -> dict[str, str]:
        """The client's headers to send on (with `--backend-api-key`, its own key)."""
        drop = HOP_HEADERS | ({"authorization"} if self.auth else set())
        headers = {k: v for k, v in request.headers.items() if k.lower() not in drop}
        return {**headers, **self.auth}

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

    async def _send(self, decision: Decision, path: str, raw: bytes, headers: dict[str, str],
                    stream: bool, timing: Timing) -> Response:
        url = self.backends.by_instance(decision.instance_id).url + path
        upstream = self.client.build_request("POST", url, content=raw, headers=headers)
        try:
            reply = await self.client.send(upstream, stream=True)
        except httpx.HTTPError as err:
            raise _Failed(f"{type(err).__name__}: {err}") from None
        if reply.status_code in RETRY_STATUSES:
            await reply.aclose()
            raise _Failed(f"answered {reply.status_code}")
        timing.lap("backend")
        out_headers = {k: v for k, v in reply.headers.items()
                       if k.lower() not in HOP_HEADERS | {"content-encoding"}}
        out_headers["x-hybridkv-backend"] = decision.instance_id
        out_headers["server-timing"] = timing.header()
        if stream and reply.status_code == 200:
            return StreamingResponse(self._relay(decision, reply), status_code=200,
                                     headers=out_headers)
        try:
            content = await reply.aread()
        except httpx.HTTPError as err:
            raise _Failed(f"{type(err).__name__}: {err}") from None
        finally:
            await reply.aclose()
        self.router.finished(decision)
        self.metrics.answered(decision, reply.status_code)
        return Response(content, status_code=reply.status_code, headers=out_headers)

    async def _relay(self, decision: Decision, reply: httpx.Response) -> AsyncIterator[bytes]:
        failed = False
        try:
            async for chunk in reply.aiter_raw():
                self.router.first_token(decision)
                yield chunk
        except httpx.HTTPError as err:
            logger.warning("backend %s failed mid-stream: %s", decision.instance_id, err)
            self.backends.mark_down(self.backends.by_instance(decision.instance_id), str(err))
            failed = True
            message = {"error": {"message": f"backend {decision.instance_id} failed "
                                 "mid-stream", "type": "service_unavailable", "param": None,
                                 "code": "backend_failed"}}
            yield f"data: {json.dumps(message)}\n\n".encode()
        finally:
            await reply.aclose()
            self.router.finished(decision)
            if failed:
                self.metrics.stream_failed(decision)
            else:
                self.metrics.answered(decision, reply.status_code)


def build_app(state: RouterApp) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await state.backends.check_all()
        checker = asyncio.create_task(state.backends.run())
        yield
        checker.cancel()
        await state.zmq.close()
        if state.streams is not None:
            await state.streams.close()
        if state.store is not None:
            await state.store.close()
        await state.client.aclose()

    app = FastAPI(title="hybridkv router", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        if state.backends.healthy():
            return Response(status_code=200)
        return error(503, "no healthy backend", code="no_backend")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> Response:
        seen: dict[str, Any] = {}
        for backend in state.backends.healthy():
            if backend.model and backend.model not in seen:
                seen[backend.model] = {"id": backend.model, "object": "model",
                                       "owned_by": "hybridkv"}
        return JSONResponse({"object": "list", "data": list(seen.values())})

    @app.post("/route/explain")
    async def explain(request: Request) -> Response:
        """What the policy would decide for a completion or chat body, sending
        nothing: the backend and, per backend, reusable tokens, chain and load."""
        try:
            body = json.loads(await request.body())
        except ValueError:
            return error(400, "the request body is not JSON", "body")
        if not isinstance(body, dict):
            return error(400, "the request body must be a JSON object", "body")
        problem = unencodable(await request.body(), body)
        if problem is not None:
            return error(400, problem, "body")
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        headers = state.backend_headers(request)
        tokens = await state.prompt_tokens(path, body, headers)
        if not tokens:
            return error(400, "the prompt could not be turned into token ids", "prompt")
        salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
        model = body.get("model") if isinstance(body.get("model"), str) else None
        stored = await state.store.stored(PromptHashes(tokens, salt)) if state.store else None
        return JSONResponse(state.router.explain(tokens, cache_salt=salt, model=model,
                                                 stored=stored))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _answer(state, request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _answer(state, request, "/v1/chat/completions")

    return app


async def _answer(state: RouterApp, request: Request, path: str) -> Response:
    """Forward the request, through the fleet-wide semantic cache when there is one."""
    run = lambda: state.forward(request, path)  # noqa: E731
    if state.semantic is None:
        return await run()
    try:
        body = json.loads(await request.body())
    except ValueError:
        return await run()  # forward answers the 400
    if not isinstance(body, dict):
        return await run()
    return await state.semantic.handle(body, path.endswith("chat/completions"),
                                       request.headers.get("authorization"), run)
