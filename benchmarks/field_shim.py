"""A pass-through proxy per backend that drops request fields hybridkv does not know.

vllm-router and sglang-router add SGLang fields (e.g. `no_stop_trim`) to the
bodies they forward; vLLM ignores unknown fields, `hybridkv serve` answers
400 naming them (its contract). `bench_routers.py` puts this shim in front
of every backend for EVERY router, hybridkv's included, so all pay the same
extra hop. Everything else passes unchanged (streams as they come); the
fields dropped are counted at `GET /shim/stats`.

    python benchmarks/field_shim.py 9001=http://127.0.0.1:8001 9002=http://127.0.0.1:8002
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from hybridkv.serving.protocol import ChatCompletionRequest, CompletionRequest

KNOWN = {"/v1/chat/completions": set(ChatCompletionRequest.model_fields),
         "/v1/completions": set(CompletionRequest.model_fields)}
HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


def make_app(backend: str, client: httpx.AsyncClient) -> Starlette:
    dropped: dict[str, int] = {}

    async def stats(_: Request) -> Response:
        return JSONResponse({"dropped": dropped})

    async def forward(request: Request) -> Response:
        path = request.url.path
        body = await request.body()
        known = KNOWN.get(path)
        if request.method == "POST" and known is not None and body:
            payload = json.loads(body)
            for name in set(payload) - known:
                dropped[name] = dropped.get(name, 0) + 1
                del payload[name]
            body = json.dumps(payload).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        upstream = client.build_request(request.method, backend + path, content=body,
                                        headers=headers, params=request.query_params)
        reply = await client.send(upstream, stream=True)
        out = {k: v for k, v in reply.headers.items()
               if k.lower() not in HOP | {"content-encoding"}}

        async def relay():
            try:
                async for chunk in reply.aiter_raw():
                    yield chunk
            finally:
                await reply.aclose()
        return StreamingResponse(relay(), status_code=reply.status_code, headers=out)

    return Starlette(routes=[Route("/shim/stats", stats),
                             Route("/{path:path}", forward, methods=["GET", "POST"])])


async def serve(pairs: list[tuple[int, str]]) -> None:
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0),
                               limits=httpx.Limits(max_connections=500))
    servers = [uvicorn.Server(uvicorn.Config(make_app(url, client), host="127.0.0.1",
                                             port=port, log_level="warning",
                                             access_log=False))
               for port, url in pairs]
    await asyncio.gather(*(s.serve() for s in servers))


def main(argv: list[str]) -> None:
    pairs = []
    for text in argv:
        port, _, url = text.partition("=")
        pairs.append((int(port), url.rstrip("/")))
    asyncio.run(serve(pairs))


if __name__ == "__main__":
    main(sys.argv[1:])
