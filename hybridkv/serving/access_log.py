"""`--access-log`: one line per request (method, path, status, latency).

A plain ASGI wrapper rather than an HTTP middleware class, so streamed
responses and disconnect detection pass through untouched. The latency runs
until the last body byte is sent (the whole stream for a streamed answer).
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger("hybridkv.access")


class AccessLog:
    """Wraps an ASGI `app`; logs `METHOD PATH STATUS LATENCYms` to `hybridkv.access`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [0]

        async def logged_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                _log(scope, status[0], start)

        try:
            await self.app(scope, receive, logged_send)
        except BaseException:
            _log(scope, status[0] or 500, start)
            raise


def _log(scope: dict[str, Any], status: int, start: float) -> None:
    client = scope.get("client") or ("-", 0)
    logger.info("%s %s %s %d %.1fms", client[0], scope["method"], scope["path"], status,
                (time.perf_counter() - start) * 1000)
