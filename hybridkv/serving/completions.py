"""`/v1/completions` and `/v1/chat/completions`: requests in, choices out.

A request becomes one engine sequence per (prompt, sample): choice
`i * n + j` is sample j of prompt i (seed `seed + j`). The handler waits
until the engine has accepted every sequence (so refusals are a 400, not a
broken stream), then either collects the tokens or streams them as
server-sent events. A client that disconnects, streamed or not, has its
sequences aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from hybridkv.engine.sampling import SamplingParams
from hybridkv.serving.async_engine import AsyncEngine, Delta, EngineRequest
from hybridkv.serving.detokenizer import IncrementalText, final_text
from hybridkv.serving.errors import APIError, bad_request
from hybridkv.serving.prompts import (
    CHAT_DEFAULT_MAX_TOKENS,
    COMPLETION_DEFAULT_MAX_TOKENS,
    PromptBuilder,
    not_found_model,
)
from hybridkv.serving.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    SamplingFields,
    make_usage,
)

RETRY_AFTER_SECONDS = 1


@dataclass
class _Choice:
    """What one choice has produced so far."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0


@dataclass
class _Job:
    """One HTTP request's sequences and how to report them."""

    chat: bool
    body: SamplingFields
    prompts: list[list[int]]
    requests: list[EngineRequest]
    id: str
    created: int = field(default_factory=lambda: int(time.time()))


class CompletionService:
    """Answers completion and chat requests with `engine`."""

    def __init__(self, engine: AsyncEngine, prompts: PromptBuilder, model_name: str,
                 max_live: int, metrics: Any = None) -> None:
        self.engine = engine
        self.prompts = prompts
        self.model_name = model_name
        self.max_live = max_live
        self.metrics = metrics
        self._id_prefix = secrets.token_hex(6)  # ids unique across restarts, no syscall each
        self._ids = itertools.count()

    # ---- entry points --------------------------------------------------------

    async def completion(self, body: CompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        self._check_model(body.model)
        prompts = self.prompts.completion_prompts(body.prompt)
        limits = [self.prompts.max_tokens(body.max_tokens, len(p), prompt_param="prompt",
                                          limit_param="max_tokens",
                                          default=COMPLETION_DEFAULT_MAX_TOKENS)
                  for p in prompts]
        job = self._job(False, body, prompts, limits, arrival, "cmpl")
        return await self._run(job, request)

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        self._check_model(body.model)
        prompt = self.prompts.chat_prompt(body.messages)
        limit_param = "max_completion_tokens" if body.max_completion_tokens is not None \
            else "max_tokens"
        limit = self.prompts.max_tokens(body.output_limit, len(prompt), prompt_param="messages",
                                        limit_param=limit_param, default=CHAT_DEFAULT_MAX_TOKENS)
        job = self._job(True, body, [prompt], [limit], arrival, "chatcmpl")
        return await self._run(job, request)

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise not_found_model(name, self.model_name)

    def _job(self, chat: bool, body: SamplingFields, prompts: list[list[int]],
             limits: list[int], arrival: float, kind: str) -> _Job:
        stop = self.prompts.check_stop(body.stop)
        if body.stop_token_ids:
            self.prompts.check_token_ids(body.stop_token_ids, "stop_token_ids")
        if len(prompts) * body.n > self.max_live:
            raise bad_request(f"n: {len(prompts)} prompts x n={body.n} sequences are more than "
                              f"this server ever runs or queues at once ({self.max_live})", "n")
        job_id = f"{kind}-{self._id_prefix}{next(self._ids)}"
        requests = []
        for i, (ids, limit) in enumerate(zip(prompts, limits)):
            for j in range(body.n):
                params = _sampling_params(body, limit, stop, j)
                requests.append(EngineRequest(f"{job_id}-{i}-{j}", ids, params,
                                              body.cache_salt, arrival, body.stream))
        return _Job(chat, body, prompts, requests, job_id)

    # ---- running -------------------------------------------------------------

    async def _run(self, job: _Job, request: Request) -> Response:
        self._admit(len(job.requests))
        deltas = self.engine.generate(job.requests)
        if job.body.stream:
            try:  # refusals are a 400 before the stream starts
                await self._accepted(deltas, len(job.requests), job.chat)
            except BaseException:
                await deltas.aclose()
                raise
            return StreamingResponse(self._stream(job, deltas), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        choices = await _until_disconnect(request, self._collect(deltas, len(job.requests),
                                                                 job.chat))
        if choices is None:  # the client left; nobody reads this
            return Response(status_code=499)
        return Response(self._response(job, choices).model_dump_json(),
                        media_type="application/json")

    def _admit(self, num_sequences: int) -> None:
        if self.engine.num_live + num_sequences > self.max_live:
            if self.metrics is not None:
                self.metrics.record_rejected()
            raise APIError(429, f"the server is busy ({self.engine.num_live} sequences queued "
                                f"or running, at most {self.max_live}); retry later",
                           code="queue_full", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        if not self.engine.is_running:
            raise APIError(503, "the engine is not running", code="engine_unavailable")

    @staticmethod
    async def _accepted(deltas: AsyncGenerator[Delta, None], count: int, chat: bool) -> None:
        for _ in range(count):
            _check(await anext(deltas), chat)

    @staticmethod
    async def _collect(deltas: AsyncGenerator[Delta, None], count: int,
                       chat: bool) -> list[_Choice]:
        choices = [_Choice() for _ in range(count)]
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                _apply(choices[delta.index], _check(delta, chat))
        return choices

    def _response(self, job: _Job, choices: list[_Choice]) -> Any:
        tokenizer = self.prompts.tokenizer
        usage = self._usage(job, choices)
        want_ids = job.body.return_token_ids
        if job.chat:
            return ChatCompletionResponse(id=job.id, created=job.created, model=self.model_name,
                                          usage=usage, choices=[
                ChatChoice(index=i, message=AssistantMessage(
                    content=final_text(tokenizer, c.token_ids, c.stop_reason)),
                    finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                    token_ids=c.token_ids if want_ids else None,
                    prompt_token_ids=job.prompts[0] if want_ids else None)
                for i, c in enumerate(choices)])
        n = job.body.n
        return CompletionResponse(id=job.id, created=job.created, model=self.model_name,
                                  usage=usage, choices=[
            CompletionChoice(index=i, text=final_text(tokenizer, c.token_ids, c.stop_reason),
                             finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                             token_ids=c.token_ids if want_ids else None,
                             prompt_token_ids=job.prompts[i // n] if want_ids else None)
            for i, c in enumerate(choices)])

    @staticmethod
    def _usage(job: _Job, choices: list[_Choice]) -> Any:
        n = job.body.n
        cached = sum(max(c.num_cached_tokens for c in choices[i * n:(i + 1) * n])
                     for i in range(len(job.prompts)))
        return make_usage(sum(map(len, job.prompts)), sum(len(c.token_ids) for c in choices),
                          cached)

    # ---- streaming -----------------------------------------------------------

    async def _stream(self, job: _Job, deltas: AsyncGenerator[Delta, None]
                      ) -> AsyncIterator[str]:
        choices = [_Choice() for _ in job.requests]
        texts = [IncrementalText(self.prompts.tokenizer, job.requests[0].params.stop)
                 for _ in job.requests] if self.prompts.tokenizer is not None else []
        async with contextlib.aclosing(deltas):
            if job.chat:
                yield self._chat_chunk(job, [ChatChunkChoice(
                    index=i, delta=DeltaMessage(role="assistant", content=""))
                    for i in range(len(choices))])
            try:
                async for delta in deltas:
                    _apply(choices[delta.index], _check(delta, job.chat))
                    text = texts[delta.index].push(delta.token_ids,
                                                   delta.finish_reason is not None,
                                                   delta.stop_reason) if texts else ""
                    if text or delta.finish_reason is not None or (
                            delta.token_ids and (job.body.return_token_ids or not texts)):
                        yield self._chunk(job, delta, text)
            except APIError as err:  # the engine failed after the stream began
                yield f"data: {json.dumps(err.body())}\n\n"
                return
            options = job.body.stream_options
            if options is not None and options.include_usage:
                yield self._usage_chunk(job, choices)
            yield "data: [DONE]\n\n"

    def _chunk(self, job: _Job, delta: Delta, text: str) -> str:
        ids = delta.token_ids if job.body.return_token_ids else None
        if job.chat:
            return self._chat_chunk(job, [ChatChunkChoice(
                index=delta.index, delta=DeltaMessage(content=text),
                finish_reason=delta.finish_reason, stop_reason=delta.stop_reason,
                token_ids=ids)])
        body = CompletionResponse(id=job.id, created=job.created, model=self.model_name,
                                  choices=[CompletionChoice(
                                      index=delta.index, text=text,
                                      finish_reason=delta.finish_reason,
                                      stop_reason=delta.stop_reason, token_ids=ids)])
        return f"data: {body.model_dump_json()}\n\n"

    def _chat_chunk(self, job: _Job, choices: list[ChatChunkChoice]) -> str:
        chunk = ChatCompletionChunk(id=job.id, created=job.created, model=self.model_name,
                                    choices=choices)
        return f"data: {chunk.model_dump_json()}\n\n"

    def _usage_chunk(self, job: _Job, choices: list[_Choice]) -> str:
        usage = self._usage(job, choices)
        if job.chat:
            body: Any = ChatCompletionChunk(id=job.id, created=job.created,
                                            model=self.model_name, choices=[], usage=usage)
        else:
            body = CompletionResponse(id=job.id, created=job.created, model=self.model_name,
                                      choices=[], usage=usage)
        return f"data: {body.model_dump_json()}\n\n"


def _sampling_params(body: SamplingFields, max_tokens: int, stop: tuple[str, ...],
                     sample: int) -> SamplingParams:
    """The engine's parameters of sample `sample` (seed + sample); 400 naming the field."""
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=body.temperature,
            seed=None if body.seed is None else body.seed + sample,
            ignore_eos=body.ignore_eos, top_p=body.top_p, top_k=body.top_k, stop=stop,
            stop_token_ids=tuple(body.stop_token_ids or ()))
    except ValueError as err:
        found = re.search(r"SamplingParams\.(\w+)", str(err))
        raise bad_request(str(err), found.group(1) if found else None) from None


def _check(delta: Delta, chat: bool) -> Delta:
    """`delta`, or the APIError it carries (a refusal names the prompt field)."""
    if delta.error is None:
        return delta
    if delta.status == 400:
        raise bad_request(delta.error, "messages" if chat else "prompt")
    raise APIError(delta.status, delta.error, code="engine_error")


def _apply(choice: _Choice, delta: Delta) -> None:
    choice.token_ids.extend(delta.token_ids)
    if delta.finish_reason is not None:
        choice.finish_reason = delta.finish_reason
        choice.stop_reason = delta.stop_reason
        choice.num_cached_tokens = delta.num_cached_tokens


async def _until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """`await work`, or cancel it and return None when the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
