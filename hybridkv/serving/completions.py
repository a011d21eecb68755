"""`/v1/completions` and `/v1/chat/completions`: requests in, choices out.

A request becomes one engine sequence per (prompt, sample): choice
`i * n + j` is sample j of prompt i (seed `seed + j`). The handler waits
until the engine has accepted every sequence (so refusals are a 400, not a
broken stream), then either collects the tokens or streams them as
server-sent events. A client that disconnects, streamed or not, has its
sequences aborted.

Tokenizing, chat templating, detokenizing and writing bodies run on a
worker thread pool (`TextWorkers`), so the event loop only moves bytes; an
error in that work fails the one request (500 naming the cause, or an error
event in its stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from hybridkv.engine.sampling import SamplingParams
from hybridkv.serving.async_engine import AsyncEngine, Delta, EngineRequest
from hybridkv.serving.choices import Choice, ChunkWriter, Job, ResponseBuilder, apply, error_event
from hybridkv.serving.errors import APIError, bad_request
from hybridkv.serving.prompts import (
    CHAT_DEFAULT_MAX_TOKENS,
    COMPLETION_DEFAULT_MAX_TOKENS,
    PromptBuilder,
    not_found_model,
)
from hybridkv.serving.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields

logger = logging.getLogger("hybridkv.serving")
T = TypeVar("T")

RETRY_AFTER_SECONDS = 1
TEXT_WORKERS = 4  # threads for tokenizing / detokenizing


class TextWorkers:
    """A small thread pool for the text work of requests (`await run(fn, *args)`)."""

    def __init__(self, num_threads: int = TEXT_WORKERS) -> None:
        self.pool = ThreadPoolExecutor(num_threads, thread_name_prefix="hybridkv-text")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class CompletionService:
    """Answers completion and chat requests with `engine`."""

    def __init__(self, engine: AsyncEngine, prompts: PromptBuilder, model_name: str,
                 max_live: int, metrics: Any = None, workers: TextWorkers | None = None
                 ) -> None:
        self.engine = engine
        self.prompts = prompts
        self.model_name = model_name
        self.max_live = max_live
        self.metrics = metrics
        self.workers = workers or TextWorkers()
        self.builder = ResponseBuilder(prompts.tokenizer, model_name)
        self._id_prefix = secrets.token_hex(6)  # ids unique across restarts, no syscall each
        self._ids = itertools.count()

    # ---- entry points --------------------------------------------------------

    async def completion(self, body: CompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        self._check_model(body.model)
        self.prompts.check_prompt_chars(body.prompt)
        prompts = await self.workers.run(self.prompts.completion_prompts, body.prompt)
        limits = [self.prompts.max_tokens(body.max_tokens, len(p), prompt_param="prompt",
                                          limit_param="max_tokens",
                                          default=COMPLETION_DEFAULT_MAX_TOKENS)
                  for p in prompts]
        texts = _prompt_texts(body.prompt, len(prompts))
        job = self._job(False, body, prompts, texts, limits, arrival, "cmpl")
        return await self._run(job, request)

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        self._check_model(body.model)
        self.prompts.check_chat_chars(body.messages)
        prompt = await self.workers.run(self.prompts.chat_prompt, body.messages)
        limit_param = "max_completion_tokens" if body.max_completion_tokens is not None \
            else "max_tokens"
        limit = self.prompts.max_tokens(body.output_limit, len(prompt), prompt_param="messages",
                                        limit_param=limit_param, default=CHAT_DEFAULT_MAX_TOKENS)
        job = self._job(True, body, [prompt], [None], [limit], arrival, "chatcmpl")
        return await self._run(job, request)

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise not_found_model(name, self.model_name)

    def _job(self, chat: bool, body: SamplingFields, prompts: list[list[int]],
             texts: list[str | None], limits: list[int], arrival: float, kind: str) -> Job:
        stop = self.prompts.check_stop(body.stop)
        if body.stop_token_ids:
            self.prompts.check_token_ids(body.stop_token_ids, "stop_token_ids")
        bias = body.logit_bias_ids
        if bias:
            self.prompts.check_token_ids(list(bias), "logit_bias")
        if len(prompts) * body.n > self.max_live:
            raise bad_request(f"n: {len(prompts)} prompts x n={body.n} sequences are more than "
                              f"this server ever runs or queues at once ({self.max_live})", "n")
        job_id = f"{kind}-{self._id_prefix}{next(self._ids)}"
        job = Job(chat, body, prompts, texts, [], job_id)
        for i, (ids, limit) in enumerate(zip(prompts, limits)):
            for j in range(body.n):
                params = sampling_params(body, limit, stop, j, job.num_logprobs, job.echo)
                job.requests.append(EngineRequest(f"{job_id}-{i}-{j}", ids, params,
                                                  body.cache_salt, arrival, body.stream))
        return job

    # ---- running -------------------------------------------------------------

    async def _run(self, job: Job, request: Request) -> Response:
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
        body = await self.workers.run(self.builder.response_json, job, choices)
        return Response(body, media_type="application/json")

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
                       chat: bool) -> list[Choice]:
        choices = [Choice() for _ in range(count)]
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                apply(choices[delta.index], _check(delta, chat))
        return choices

    # ---- streaming -----------------------------------------------------------

    async def _stream(self, job: Job, deltas: AsyncGenerator[Delta, None]
                      ) -> AsyncIterator[str]:
        writer = ChunkWriter(self.builder, job)
        async with contextlib.aclosing(deltas):
            try:
                # the role chunk goes out with the first token, not before the prefill
                # (as vLLM does), so a client's time to first chunk is time to first token
                first = writer.first()
                async for delta in deltas:
                    if first:
                        yield first
                        first = ""
                    event = await self.workers.run(writer.push, _check(delta, job.chat))
                    if event:
                        yield event
                options = job.body.stream_options
                if options is not None and options.include_usage:
                    yield writer.usage()
            except APIError as err:  # the request failed after the stream began
                yield error_event(err.body())
                return
            except Exception as err:  # noqa: BLE001 - this stream alone fails
                logger.exception("stream %s failed", job.id)
                yield error_event(APIError(500, f"request failed: {err!r}").body())
                return
            yield "data: [DONE]\n\n"


def _prompt_texts(prompt: Any, count: int) -> list[str | None]:
    """Each prompt's text as sent (None for a token-id prompt)."""
    if isinstance(prompt, str):
        return [prompt]
    if count == 1 and not (prompt and isinstance(prompt[0], str | list)):
        return [None]
    return [p if isinstance(p, str) else None for p in prompt]


def sampling_params(body: SamplingFields, max_tokens: int, stop: tuple[str, ...], sample: int,
                    num_logprobs: int | None = None, echo: bool = False) -> SamplingParams:
    """The engine's parameters of sample `sample` (seed + sample); 400 naming the field.

    vLLM's extras are passed only when they differ from the neutral value.
    """
    if body.min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({body.min_tokens}) must be at most the output limit "
                          f"({max_tokens})", "min_tokens")
    extras: dict[str, Any] = {}
    for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                          ("frequency_penalty", 0.0), ("min_tokens", 0),
                          ("skip_special_tokens", True)):
        if getattr(body, name) != neutral:
            extras[name] = getattr(body, name)
    if body.logit_bias_ids:
        extras["logit_bias"] = body.logit_bias_ids
    if num_logprobs is not None:
        extras["logprobs"] = num_logprobs
        if echo:
            extras["prompt_logprobs"] = num_logprobs
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=body.temperature,
            seed=None if body.seed is None else body.seed + sample,
            ignore_eos=body.ignore_eos, top_p=body.top_p, top_k=body.top_k, stop=stop,
            stop_token_ids=tuple(body.stop_token_ids or ()), **extras)
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
