"""The router's HTTP surface: `/health`, `/metrics`, `/v1/models`,
`POST /route/explain` on FastAPI, and the proxied completion and chat routes
ahead of it (`ProxyFront`: no framework layer between the socket and
`RouterApp.forward`), through the fleet-wide semantic cache when configured.

`POST /route/explain` takes a completion or chat body and answers what the
policy would decide, sending nothing (per backend: reusable tokens, cached
full-attention chain, health and load).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from hybridkv.serving.errors import install_error_handlers
from hybridkv.serving.router.app import RouterApp, error, unencodable
from hybridkv.serving.router.relay import Headers, ProxyFront
from hybridkv.serving.router.routing import PromptHashes

PROXIED = {"/v1/completions", "/v1/chat/completions"}


def build_app(state: RouterApp) -> ProxyFront:
    """The router's ASGI app: the proxied routes bare (`ProxyFront`), the rest on
    FastAPI."""
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
        await state.backends.close()
        await state.upstream.close()

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
        headers = state.backend_headers(request.scope["headers"])
        tokens = await state.prompt_tokens(path, body, headers)
        if not tokens:
            return error(400, "the prompt could not be turned into token ids", "prompt")
        salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
        model = body.get("model") if isinstance(body.get("model"), str) else None
        stored = await state.store.stored(PromptHashes(tokens, salt)) if state.store else None
        return JSONResponse(state.router.explain(tokens, cache_salt=salt, model=model,
                                                 stored=stored))

    return ProxyFront(app, lambda path, raw, headers: _answer(state, path, raw, headers),
                      PROXIED)


async def _answer(state: RouterApp, path: str, raw: bytes, headers: Headers) -> Response:
    """Forward the request, through the fleet-wide semantic cache when there is one."""
    run = lambda: state.forward(path, raw, headers)  # noqa: E731
    if state.semantic is None:
        return await run()
    try:
        body = json.loads(raw)
    except ValueError:
        return await run()  # forward answers the 400
    if not isinstance(body, dict):
        return await run()
    authorization = next((v.decode("latin-1") for k, v in headers
                          if k.lower() == b"authorization"), None)
    return await state.semantic.handle(body, path.endswith("chat/completions"),
                                       authorization, run)
