"""The HTTP side of the cache, shared by `hybridkv serve` and `hybridkv route`:
one call wraps a completion or chat handler.

    front = SemanticFront(cache, model_name, count_tokens)
    return await front.handle(body_dict, chat, authorization, run_model)

Not reusable or opted out: `run_model()` as it is, no header. A hit: the
stored answer, whole or as server-sent events (all in one body), header
`x-hybridkv-semantic-cache: hit; similarity=0.93`. Otherwise `run_model()`,
header `...: miss`; once its answer is complete (the whole body read, or
the stream's last event passed to the client) the answer is stored, and for
a candidate picked for verification compared with the candidate's. A
failing store costs a miss.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from hybridkv.semantic.cache import Lookup, SemanticCache
from hybridkv.semantic.responses import Answer, hit_body, hit_events, read_answer, usage
from hybridkv.semantic.reuse import request_key

logger = logging.getLogger("hybridkv.semantic")
HEADER = "x-hybridkv-semantic-cache"


class SemanticFront:
    """`handle` one request through `cache`; `count_tokens(text)` (optional) gives
    a hit's token counts for `usage`."""

    def __init__(self, cache: SemanticCache, model_name: str,
                 count_tokens: Callable[[str], int] | None = None) -> None:
        self.cache = cache
        self.model_name = model_name
        self.count_tokens = count_tokens
        self._pending: set[asyncio.Future] = set()  # stores in flight (kept referenced)

    async def handle(self, body: dict[str, Any], chat: bool, authorization: str | None,
                     run: Callable[[], Awaitable[Response]]) -> Response:
        model = body.get("model") or self.model_name
        key = request_key(body, chat, str(model), authorization)
        if key is None:
            return await run()
        found = await self._call(self.cache.lookup, *key)
        if found is not None and found.action == "serve":
            return self._hit(body, chat, str(model), found)
        response = await run()
        response.headers[HEADER] = "miss"
        if found is not None and response.status_code == 200:
            self._capture(response, found, chat, bool(body.get("stream")))
        return response

    # ---- hits ----------------------------------------------------------------

    def _hit(self, body: dict[str, Any], chat: bool, model: str, found: Lookup) -> Response:
        entry = found.entry
        assert entry is not None
        answer = Answer(entry.answer, entry.finish_reason, entry.completion_tokens)
        use = usage(self._tokens(found.text), answer.completion_tokens
                    if answer.completion_tokens is not None else self._tokens(answer.text))
        headers = {HEADER: f"hit; similarity={found.similarity:.4f}"}
        if not body.get("stream"):
            return JSONResponse(hit_body(chat, model, answer, use), headers=headers)
        options = body.get("stream_options") or {}
        with_usage = use if isinstance(options, dict) and options.get("include_usage") else None
        # the whole answer is known: every event in one body, written at once (a
        # streamed reply would cost a socket write and a client wake-up per event)
        events = "".join(hit_events(chat, model, answer, with_usage))
        return Response(events, media_type="text/event-stream",
                        headers={**headers, "Cache-Control": "no-cache"})

    def _tokens(self, text: str) -> int:
        if self.count_tokens is None:
            return 0
        try:
            return self.count_tokens(text)
        except Exception:  # counting is cosmetic; never fail a hit over it
            return 0

    # ---- misses --------------------------------------------------------------

    def _capture(self, response: Response, found: Lookup, chat: bool, streamed: bool) -> None:
        """Store the answer once `response` has been fully produced."""
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._tee(response.body_iterator, found, chat, streamed)
        else:
            answer = read_answer(bytes(response.body), chat, streamed)
            if answer is not None:
                task = asyncio.ensure_future(self._learn(found, answer))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)

    async def _tee(self, chunks: AsyncIterable[Any], found: Lookup, chat: bool,
                   streamed: bool) -> AsyncIterator[Any]:
        seen: list[bytes] = []
        async for chunk in chunks:
            seen.append(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
            yield chunk
        answer = read_answer(b"".join(seen), chat, streamed)
        if answer is not None:
            await self._learn(found, answer)

    async def _learn(self, found: Lookup, answer: Answer) -> None:
        if found.action == "verify" and found.entry is not None:
            self.cache.verify(found, answer.text)
        await self._call(self.cache.insert, found, answer.text, answer.finish_reason,
                         answer.completion_tokens)

    async def _call(self, work: Callable[..., Any], *args: Any) -> Any:
        """`work(*args)`, off the event loop when the store is remote; None (a miss)
        when it fails."""
        try:
            if self.cache.is_remote:
                return await asyncio.to_thread(work, *args)
            return work(*args)
        except Exception:  # the cache must never fail a request
            logger.exception("semantic cache: %s failed; treated as a miss", work.__name__)
            return None

