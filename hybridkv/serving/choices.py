"""From engine deltas to response bodies: text, logprobs, echo, usage.

Everything here is plain synchronous work (detokenizing, formatting
log-probabilities, serializing JSON) that the handlers run on a worker
thread, never on the event loop. `Job` describes one HTTP request;
`Choice` gathers what one of its sequences produced; `ResponseBuilder`
writes the non-streamed body and `ChunkWriter` the server-sent events of a
streamed one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from hybridkv.serving.async_engine import Delta, EngineRequest
from hybridkv.serving.detokenizer import IncrementalText, final_text
from hybridkv.serving.logprobs import (
    chat_logprobs,
    completion_logprobs,
    next_offset,
)
from hybridkv.serving.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
    SamplingFields,
    make_usage,
)


@dataclass
class Job:
    """One HTTP request's sequences and how to report them (choice `i * n + j`
    is sample j of prompt i)."""

    chat: bool
    body: SamplingFields
    prompts: list[list[int]]
    prompt_texts: list[str | None]  # a text prompt as sent (echo), None for token ids
    requests: list[EngineRequest]
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def num_logprobs(self) -> int | None:
        return getattr(self.body, "num_logprobs", None)

    @property
    def echo(self) -> bool:
        return bool(getattr(self.body, "echo", False))

    def prompt_of(self, choice: int) -> int:
        return choice // self.body.n


@dataclass
class Choice:
    """What one choice has produced so far."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    prompt_logprobs: list[Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0


def apply(choice: Choice, delta: Delta) -> None:
    """Add `delta` (already checked for errors) to `choice`."""
    choice.token_ids.extend(delta.token_ids)
    choice.logprobs.extend(delta.logprobs)
    if delta.prompt_logprobs is not None:
        choice.prompt_logprobs = delta.prompt_logprobs
    if delta.finish_reason is not None:
        choice.finish_reason = delta.finish_reason
        choice.stop_reason = delta.stop_reason
        choice.num_cached_tokens = delta.num_cached_tokens


class ResponseBuilder:
    """Writes bodies for one model's responses with `tokenizer` (None: token ids only)."""

    def __init__(self, tokenizer: Any, model_name: str) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name

    def usage(self, job: Job, choices: list[Choice]) -> Any:
        n = job.body.n
        cached = sum(max(c.num_cached_tokens for c in choices[i * n:(i + 1) * n])
                     for i in range(len(job.prompts)))
        return make_usage(sum(map(len, job.prompts)), sum(len(c.token_ids) for c in choices),
                          cached)

    def prompt_text(self, job: Job, prompt: int) -> str:
        """The echoed text of prompt `prompt`: as sent, or its ids decoded."""
        text = job.prompt_texts[prompt]
        if text is not None:
            return text
        if self.tokenizer is None:
            return ""
        return str(self.tokenizer.decode(job.prompts[prompt],
                                         skip_special_tokens=job.body.skip_special_tokens))

    def response_json(self, job: Job, choices: list[Choice]) -> str:
        """The non-streamed body, serialized."""
        return self._response(job, choices).model_dump_json()

    def _response(self, job: Job, choices: list[Choice]) -> Any:
        usage = self.usage(job, choices)
        if job.chat:
            return ChatCompletionResponse(id=job.id, created=job.created, model=self.model_name,
                                          usage=usage, choices=[
                                              self._chat_choice(job, i, c)
                                              for i, c in enumerate(choices)])
        return CompletionResponse(id=job.id, created=job.created, model=self.model_name,
                                  usage=usage, choices=[self._completion_choice(job, i, c)
                                                        for i, c in enumerate(choices)])

    def _text(self, job: Job, choice: Choice) -> str:
        return final_text(self.tokenizer, choice.token_ids, choice.stop_reason,
                          job.body.skip_special_tokens)

    def _chat_choice(self, job: Job, i: int, c: Choice) -> ChatChoice:
        want_ids = job.body.return_token_ids
        k = job.num_logprobs
        return ChatChoice(index=i, message=AssistantMessage(content=self._text(job, c)),
                          logprobs=None if k is None else
                          chat_logprobs(self.tokenizer, c.logprobs, k),
                          finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                          token_ids=c.token_ids if want_ids else None,
                          prompt_token_ids=job.prompts[0] if want_ids else None)

    def _completion_choice(self, job: Job, i: int, c: Choice) -> CompletionChoice:
        want_ids = job.body.return_token_ids
        prompt = job.prompt_of(i)
        text = self._text(job, c)
        head = self.prompt_text(job, prompt) if job.echo else ""
        return CompletionChoice(index=i, text=head + text,
                                logprobs=self._completion_logprobs(job, prompt, c),
                                finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                                token_ids=c.token_ids if want_ids else None,
                                prompt_token_ids=job.prompts[prompt] if want_ids else None)

    def _completion_logprobs(self, job: Job, prompt: int, c: Choice) -> Any:
        k = job.num_logprobs
        if k is None:
            return None
        ids, entries = list(c.token_ids), list(c.logprobs)
        if job.echo and c.prompt_logprobs is not None:
            ids = job.prompts[prompt] + ids
            entries = list(c.prompt_logprobs) + entries
        return completion_logprobs(self.tokenizer, ids, entries, k)


class ChunkWriter:
    """The server-sent events of one streamed job, one delta at a time."""

    def __init__(self, builder: ResponseBuilder, job: Job) -> None:
        self.builder = builder
        self.job = job
        self.choices = [Choice() for _ in job.requests]
        stop = job.requests[0].params.stop
        self.texts = [IncrementalText(builder.tokenizer, stop, job.body.skip_special_tokens)
                      for _ in job.requests] if builder.tokenizer is not None else []
        self.offsets = [0] * len(job.requests)  # text offset of each choice's next token
        self.echoed = [False] * len(job.requests)

    def first(self) -> str:
        """What a stream starts with: chat's role chunk ("" for completions)."""
        if not self.job.chat:
            return ""
        return self._chat_chunk([ChatChunkChoice(index=i, delta=DeltaMessage(
            role="assistant", content="")) for i in range(len(self.choices))])

    def push(self, delta: Delta) -> str:
        """The event for `delta` (already checked for errors), or "" when it adds nothing."""
        choice = self.choices[delta.index]
        apply(choice, delta)
        text = self.texts[delta.index].push(delta.token_ids, delta.finish_reason is not None,
                                            delta.stop_reason) if self.texts else ""
        if self.job.echo and not self.echoed[delta.index]:
            self.echoed[delta.index] = True
            text = self.builder.prompt_text(self.job, self.job.prompt_of(delta.index)) + text
        wants_ids = delta.token_ids and (self.job.body.return_token_ids or not self.texts
                                         or self.job.num_logprobs is not None)
        if not text and delta.finish_reason is None and not wants_ids:
            return ""
        return self._chunk(delta, text)

    def usage(self) -> str:
        usage = self.builder.usage(self.job, self.choices)
        job, model = self.job, self.builder.model_name
        if job.chat:
            body: Any = ChatCompletionChunk(id=job.id, created=job.created, model=model,
                                            choices=[], usage=usage)
        else:
            body = CompletionResponse(id=job.id, created=job.created, model=model,
                                      choices=[], usage=usage)
        return f"data: {body.model_dump_json()}\n\n"

    def _chunk(self, delta: Delta, text: str) -> str:
        job = self.job
        ids = delta.token_ids if job.body.return_token_ids else None
        if job.chat:
            k = job.num_logprobs
            logprobs = None if k is None else \
                chat_logprobs(self.builder.tokenizer, delta.logprobs, k)
            return self._chat_chunk([ChatChunkChoice(
                index=delta.index, delta=DeltaMessage(content=text), logprobs=logprobs,
                finish_reason=delta.finish_reason, stop_reason=delta.stop_reason,
                token_ids=ids)])
        body = CompletionResponse(id=job.id, created=job.created, model=self.builder.model_name,
                                  choices=[CompletionChoice(
                                      index=delta.index, text=text,
                                      logprobs=self._stream_logprobs(delta),
                                      finish_reason=delta.finish_reason,
                                      stop_reason=delta.stop_reason, token_ids=ids)])
        return f"data: {body.model_dump_json()}\n\n"

    def _stream_logprobs(self, delta: Delta) -> Any:
        job, i = self.job, delta.index
        if job.num_logprobs is None:
            return None
        ids, entries = list(delta.token_ids), list(delta.logprobs)
        if job.echo and delta.prompt_logprobs is not None:
            ids = job.prompts[job.prompt_of(i)] + ids
            entries = list(delta.prompt_logprobs) + entries
        out = completion_logprobs(self.builder.tokenizer, ids, entries, job.num_logprobs,
                                  self.offsets[i])
        if out.tokens:
            self.offsets[i] = next_offset(out)
        return out

    def _chat_chunk(self, choices: list[ChatChunkChoice]) -> str:
        job = self.job
        chunk = ChatCompletionChunk(id=job.id, created=job.created,
                                    model=self.builder.model_name, choices=choices)
        return f"data: {chunk.model_dump_json()}\n\n"


def error_event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body)}\n\n"

