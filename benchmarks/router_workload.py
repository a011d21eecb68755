"""The workload of `bench_routers.py`: chat conversations over shared documents.

Documents (runs of words from the tokenizer's sample text) are system messages, drawn
with Zipf popularity; each conversation asks several questions in turn (a turn re-sends
the conversation with the real answer and waits for it plus an exponential think time);
conversations start at Poisson times. Requests are streamed; TTFT is the time from the
send to the first streamed content (with `ignore_eos`, to the first streamed token).
Everything is fixed by the seed but the answers.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from hybridkv.tools.tokenizer_checkpoint import sample_text


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    output_tokens: int = 0
    served_by: dict[str, int] = field(default_factory=dict)


def documents(rng: random.Random, n: int, words: int) -> list[str]:
    corpus = sample_text().split()
    out = []
    for _ in range(n):
        start = rng.randrange(0, len(corpus) - words)
        out.append(" ".join(corpus[start:start + words]))
    return out


def question(rng: random.Random, corpus: list[str], words: int) -> str:
    start = rng.randrange(0, len(corpus) - words)
    return " ".join(corpus[start:start + words]) + "?"


def plan(args) -> list[tuple[float, int, list[str]]]:
    """(start time, document, user questions) per conversation, fixed by the seed."""
    rng = random.Random(args.seed)
    corpus = sample_text().split()
    weights = [1 / (k + 1) ** args.zipf for k in range(args.documents)]
    t, out = 0.0, []
    for _ in range(args.conversations):
        t += rng.expovariate(args.rate)
        doc = rng.choices(range(args.documents), weights)[0]
        out.append((t, doc, [question(rng, corpus, args.question_words)
                             for _ in range(args.turns)]))
    return out


def request_body(messages: list[dict], args) -> dict:
    body = {"model": args.model, "messages": messages, "max_tokens": args.max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        # random weights may emit EOS at once, or tokens whose text the detokenizer
        # holds back (part of a UTF-8 character): with logprobs (a field every router
        # forwards) each token comes in a chunk of its own even when no text streams
        body.update(ignore_eos=True, skip_special_tokens=False, logprobs=True)
    return body


def read_chunk(chunk: dict, text: list[str], result: Result) -> bool:
    """Append the chunk's content to `text`; True when it carries a generated token
    (content, or a token's logprob where they were asked for)."""
    produced = False
    for choice in chunk.get("choices") or []:
        piece = (choice.get("delta") or {}).get("content")
        if piece:
            text.append(piece)
        produced = produced or bool(piece) or bool((choice.get("logprobs") or {}).get("content"))
    usage = chunk.get("usage")
    if usage:
        result.output_tokens += usage.get("completion_tokens", 0)
    return produced


async def one_request(client: httpx.AsyncClient, url: str, messages: list[dict], args,
                      result: Result) -> str:
    start = time.perf_counter()
    first, text = None, []
    body = request_body(messages, args)
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            result.errors.append(f"{reply.status_code}: {(await reply.aread())[:200]!r}")
            return ""
        backend = reply.headers.get("x-hybridkv-backend", "?")
        result.served_by[backend] = result.served_by.get(backend, 0) + 1
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if read_chunk(json.loads(line[6:]), text, result):
                first = first or time.perf_counter()
    if first is None:
        result.errors.append("no token streamed")
        return ""
    result.ttft.append(first - start)
    return "".join(text)


async def conversation(client, url: str, start: float, system: str, questions: list[str],
                       args, result: Result, rng: random.Random, t0: float) -> None:
    await asyncio.sleep(max(0.0, t0 + start - time.perf_counter()))
    messages = [{"role": "system", "content": system}]
    for q in questions:
        messages.append({"role": "user", "content": q})
        try:
            answer = await one_request(client, url, messages, args, result)
        except httpx.HTTPError as err:
            result.errors.append(f"{type(err).__name__}: {err}")
            return
        messages.append({"role": "assistant", "content": answer or "."})
        await asyncio.sleep(rng.expovariate(1 / args.think))


async def run_workload(url: str, args) -> tuple[Result, float]:
    docs = documents(random.Random(args.seed + 1), args.documents, args.document_words)
    result = Result()
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        t0 = time.perf_counter()
        rng = random.Random(args.seed + 2)
        await asyncio.gather(*(conversation(client, url, start, docs[doc], qs, args, result,
                                            random.Random(rng.random()), t0)
                               for start, doc, qs in plan(args)))
        return result, time.perf_counter() - t0
