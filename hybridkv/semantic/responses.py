"""OpenAI bodies for an answer served from the cache, and the answer read back
out of a response the model produced (JSON or server-sent events).

A streamed hit is sent like a generated response: for chat a role chunk,
then the text in pieces of about `PIECE_CHARS` characters, the finish
reason, the usage chunk when `stream_options.include_usage`, `[DONE]`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

PIECE_CHARS = 24


@dataclass(slots=True)
class Answer:
    """What a response said: its text, finish reason and completion token count."""

    text: str
    finish_reason: str
    completion_tokens: int | None


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """Usage of a served hit: every prompt token counts as cached."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": prompt_tokens}}


def hit_body(chat: bool, model: str, answer: Answer, use: dict[str, Any]) -> dict[str, Any]:
    """A complete (non-streamed) response carrying `answer`."""
    head = _head(chat, model, "chat.completion" if chat else "text_completion")
    choice: dict[str, Any] = {"index": 0, "logprobs": None,
                              "finish_reason": answer.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": answer.text}
    else:
        choice["text"] = answer.text
    return {**head, "choices": [choice], "usage": use}


def hit_events(chat: bool, model: str, answer: Answer, use: dict[str, Any] | None
               ) -> Iterator[str]:
    """The server-sent events of a streamed response carrying `answer`."""
    head = _head(chat, model, "chat.completion.chunk" if chat else "text_completion")
    if chat:
        yield _event(head, _piece(chat, {"role": "assistant", "content": ""}, None))
    text = answer.text
    pieces = [text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)] or [""]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        content = {"content": piece} if chat else piece
        yield _event(head, _piece(chat, content, answer.finish_reason if last else None))
    if use is not None:
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': use})}\n\n"
    yield "data: [DONE]\n\n"


def _head(chat: bool, model: str, kind: str) -> dict[str, Any]:
    prefix = "chatcmpl" if chat else "cmpl"
    return {"id": f"{prefix}-semantic-{secrets.token_hex(8)}", "object": kind,
            "created": int(time.time()), "model": model}


def _piece(chat: bool, content: Any, finish_reason: str | None) -> dict[str, Any]:
    if chat:
        return {"index": 0, "delta": content, "logprobs": None, "finish_reason": finish_reason}
    return {"index": 0, "text": content, "logprobs": None, "finish_reason": finish_reason}


def _event(head: dict[str, Any], choice: dict[str, Any]) -> str:
    return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"


def read_answer(raw: bytes, chat: bool, streamed: bool) -> Answer | None:
    """The single choice's answer in a model's response body, or None when the body
    is not a finished one-choice answer (errors, cut streams, several choices)."""
    try:
        return _read_events(raw, chat) if streamed else _read_json(raw, chat)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def _read_json(raw: bytes, chat: bool) -> Answer | None:
    body = json.loads(raw)
    choices = body["choices"]
    if len(choices) != 1 or choices[0].get("finish_reason") is None:
        return None
    text = choices[0]["message"]["content"] if chat else choices[0]["text"]
    tokens = (body.get("usage") or {}).get("completion_tokens")
    return Answer(text or "", choices[0]["finish_reason"], tokens)


def _read_events(raw: bytes, chat: bool) -> Answer | None:
    parts: list[str] = []
    finish, tokens, done = None, None, False
    for line in raw.decode().splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            return None
        if event.get("usage"):
            tokens = event["usage"].get("completion_tokens")
        for choice in event.get("choices", []):
            if choice.get("index", 0) != 0:
                return None
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            parts.append(piece or "")
            finish = choice.get("finish_reason") or finish
    if not done or finish is None:
        return None
    return Answer("".join(parts), finish, tokens)
