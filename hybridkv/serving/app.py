"""The FastAPI application: routes, authentication, body limits, lifecycle.

Routes: `GET /health`, `GET /metrics`, `GET /version` (open), and behind `--api-key`
(`Authorization: Bearer KEY`): `GET /v1/models`, `POST /v1/completions`,
`POST /v1/chat/completions`, `POST /tokenize`, `GET /v1/kv_cache_layout`.
Bodies are read here (at most `max_body_bytes`, else 413) and parsed
strictly with the `protocol` models, so every error is an OpenAI error body.
Large bodies are parsed on a worker thread, so the event loop keeps
answering `/health` while megabytes are refused.
"""

from __future__ import annotations

import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from hybridkv.serving.async_engine import AsyncEngine, EngineDead
from hybridkv.serving.completions import CompletionService, TextWorkers
from hybridkv.serving.errors import APIError, from_validation_error, install_error_handlers
from hybridkv.serving.metrics import ServerMetrics
from hybridkv.serving.options import DEFAULT_MAX_BODY_BYTES
from hybridkv.serving.prompts import PromptBuilder, not_found_model
from hybridkv.serving.protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest

Body = TypeVar("Body", bound=BaseModel)
PARSE_ON_LOOP_BYTES = 1 << 16  # larger bodies are parsed on a worker thread


@dataclass
class ServerState:
    """Everything the routes use, built once by `server.build_state`."""

    engine: AsyncEngine
    service: CompletionService
    prompts: PromptBuilder
    metrics: ServerMetrics
    model_name: str
    layout: dict[str, Any]
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    publisher: Any = None  # EventPublisher or None
    semantic: Any = None  # hybridkv.semantic.front.SemanticFront or None
    created: int = 0
    version: str = ""


async def read_body(request: Request, model: type[Body], limit: int,
                    workers: TextWorkers | None = None) -> Body:
    """Parse the request body as `model`; 413 past `limit` bytes, 400 when invalid.
    Bodies past PARSE_ON_LOOP_BYTES are parsed on `workers` when given."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        if workers is not None and len(raw) > PARSE_ON_LOOP_BYTES:
            return await workers.run(model.model_validate_json, raw)
        return model.model_validate_json(raw)
    except ValidationError as err:
        raise from_validation_error(err) from None


def _too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"request body of {size}+ bytes is over the limit of {limit} bytes",
                    "body", "body_too_large")


def build_app(state: ServerState) -> FastAPI:
    """The server's ASGI app; starting it starts the engine thread, stopping drains it."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        if state.publisher is not None:
            state.publisher.start()
        yield
        await state.engine.stop()
        state.service.workers.close()
        if state.publisher is not None:
            state.publisher.close()

    app = FastAPI(title="hybridkv", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    install_error_handlers(app)

    @app.exception_handler(EngineDead)
    async def _engine_dead(_: Request, exc: EngineDead) -> Response:
        return APIError(503, str(exc), code="engine_unavailable").response()

    state.created = int(time.time())
    app.include_router(_open_routes(state))
    app.include_router(_api_routes(state))
    return app


def _auth(api_key: str | None):
    """A check of the API key (a plain call: cheaper than a FastAPI dependency)."""
    expected = f"Bearer {api_key}".encode()

    def check(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise APIError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                           code="invalid_api_key")

    return check


def _open_routes(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        if state.engine.is_running:
            return Response(status_code=200)
        cause = f": {state.engine.error!r}" if state.engine.error is not None else ""
        return JSONResponse(APIError(503, f"the engine is not running{cause}").body(), 503)

    @router.get("/metrics")
    async def metrics() -> Response:
        render_async = getattr(state.metrics, "render_async", None)  # engine process
        text = await render_async() if render_async is not None else state.metrics.render()
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": state.version}

    return router


async def _answer(state: ServerState, body: BaseModel, request: Request, chat: bool,
                  run: Callable[[], Awaitable[Response]]) -> Response:
    """`run()`, through the semantic cache when the server has one."""
    if state.semantic is None:
        return await run()
    return await state.semantic.handle(body.model_dump(), chat,
                                       request.headers.get("authorization"), run)


def _api_routes(state: ServerState) -> APIRouter:
    router = APIRouter()
    limit = state.max_body_bytes
    auth = _auth(state.api_key)
    workers = state.service.workers

    @router.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        auth(request)
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "hybridkv", "max_model_len": state.prompts.max_model_len}]}

    @router.get("/v1/kv_cache_layout")
    async def kv_cache_layout(request: Request) -> dict[str, Any]:
        auth(request)
        return state.layout

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        auth(request)
        body = await read_body(request, CompletionRequest, limit, workers)
        return await _answer(state, body, request, False,
                             lambda: state.service.completion(body, request))

    @router.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        auth(request)
        body = await read_body(request, ChatCompletionRequest, limit, workers)
        return await _answer(state, body, request, True,
                             lambda: state.service.chat(body, request))

    @router.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        auth(request)
        body = await read_body(request, TokenizeRequest, limit, workers)
        if body.model is not None and body.model != state.model_name:
            raise not_found_model(body.model, state.model_name)
        if body.messages is not None:
            state.prompts.check_chat_chars(body.messages)
            ids = await workers.run(state.prompts.chat_prompt, body.messages)
        else:
            state.prompts.check_prompt_chars(body.prompt)
            ids = (await workers.run(state.prompts.completion_prompts, body.prompt))[0]
        return {"tokens": ids, "count": len(ids), "max_model_len": state.prompts.max_model_len}

    return router
