"""The proxied routes as a bare ASGI endpoint, and a streamed reply relayed.

`ProxyFront` answers `POST` on the routes the router forwards (the completion
and chat endpoints) itself, ahead of the web framework: it reads the body,
hands it with the raw headers to `handle`, and sends the response it gets
back (any ASGI response: a `RelayResponse`, or a plain one). Every other
request goes to the wrapped app. The request's path names the route:

    app = ProxyFront(fastapi_app, handle, {"/v1/completions", "/v1/chat/completions"})
    # POST /v1/completions -> await handle("/v1/completions", body, headers)
    # GET /v1/completions  -> 405, an OpenAI error body

While the request is answered, the front listens for the client: if it
disconnects before the response has ended, the task answering it is
cancelled, so whatever it awaits (the backend's head or its next chunk) is
dropped at once, closing that backend connection. An exception that escapes
`handle` is logged and answered with a 500 when no response has started.

`RelayResponse` sends a backend's streamed body on as it arrives, one ASGI
body message per piece, and runs `on_close` once when it ends, fails or is
cancelled (or is never started: `close`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse

logger = logging.getLogger("hybridkv.router")

Headers = list[tuple[bytes, bytes]]
Handle = Callable[[str, bytes, Headers], Awaitable[Any]]


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> bytes:
    """An OpenAI error body (`type` from the status)."""
    kind = "invalid_request_error" if status < 500 else "service_unavailable"
    return json.dumps({"error": {"message": message, "type": kind, "param": param,
                                 "code": code}}).encode()


class RelayResponse(StreamingResponse):
    """`chunks` sent on as they come with `status` and `raw_headers`; `on_close()`
    runs once at the end, whatever ends it."""

    def __init__(self, chunks: AsyncIterable[bytes], status: int, raw_headers: Headers,
                 on_close: Callable[[], None]) -> None:
        # StreamingResponse's own __init__ would add headers this relay must not
        self.body_iterator = chunks
        self.status_code = status
        self.raw_headers = raw_headers
        self.background = None
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.close()

    def close(self) -> None:
        on_close, self.on_close = self.on_close, _nothing
        on_close()


def _nothing() -> None:
    return None


class _Exchange:
    """What has happened to one request: response started / ended, client gone."""

    __slots__ = ("started", "ended", "gone")

    def __init__(self) -> None:
        self.started = self.ended = self.gone = False


class ProxyFront:
    """An ASGI app: `handle` answers POST on `paths`, `app` everything else."""

    def __init__(self, app: Any, handle: Handle, paths: set[str]) -> None:
        self.app = app
        self.handle = handle
        self.paths = frozenset(paths)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
        elif scope["method"] != "POST":
            await _send_error(send, 405, f"method {scope['method']} is not allowed on "
                                         f"{scope['path']} (POST only)")
        else:
            body = await _read_body(receive)
            if body is not None:
                await self._answer(scope, body, receive, send)

    async def _answer(self, scope: Any, body: bytes, receive: Any, send: Any) -> None:
        exchange = _Exchange()
        task = asyncio.current_task()
        watch = asyncio.ensure_future(receive())
        watch.add_done_callback(lambda done: _on_client(done, exchange, task))

        async def tracked(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                exchange.started = True
            elif not message.get("more_body"):
                exchange.ended = True
            await send(message)

        try:
            response = await self.handle(scope["path"], body, scope["headers"])
            await response(scope, receive, tracked)
        except asyncio.CancelledError:
            if not exchange.gone:
                raise
            _uncancel(task)  # the client left: nothing to answer
        except Exception:
            logger.exception("%s failed", scope["path"])
            if not exchange.started:
                await _send_error(send, 500, f"the router failed answering {scope['path']}")
        finally:
            watch.cancel()


def _on_client(watch: asyncio.Future, exchange: _Exchange, task: Any) -> None:
    """The client sent something more: a disconnect before the end cancels `task`."""
    if watch.cancelled() or watch.exception() is not None or exchange.ended:
        return
    if watch.result().get("type") == "http.disconnect":
        exchange.gone = True
        task.cancel()


def _uncancel(task: Any) -> None:
    uncancel = getattr(task, "uncancel", None)  # Python 3.11+
    if uncancel is not None:
        uncancel()


async def _read_body(receive: Any) -> bytes | None:
    """The request body; None if the client disconnected first."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _send_error(send: Any, status: int, message: str) -> None:
    body = error_body(status, message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

