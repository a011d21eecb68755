"""Which OpenAI requests may be answered from the cache, and under which scope.

A request is reusable when its answer is a function of its input: greedy
(`temperature` 0) or seeded, one choice (`n` = 1), and nothing the cache
cannot give back (`logprobs`, `top_logprobs`, `echo`, `tools`, functions,
token ids). A completion's prompt must be one string; a chat's last message
must be the user's, in text.

The scope is a digest of everything else that shapes the answer: the model,
the endpoint, the tenant (a digest of the `Authorization` header and the
`cache_salt`), every other sampling field, and for chat every earlier message.
Entries are only ever searched within one scope.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

TEXT_FIELDS = frozenset({"prompt", "messages"})
NOT_SHAPING = frozenset({"model", "stream", "stream_options", "semantic_cache", "user"})
BLOCKING = ("tools", "functions", "tool_choice", "function_call", "logprobs", "top_logprobs",
            "echo", "return_token_ids", "response_format", "suffix", "logit_bias")


def opted_out(body: dict[str, Any]) -> bool:
    return body.get("semantic_cache") is False


def is_reusable(body: dict[str, Any]) -> bool:
    """Greedy or seeded, n == 1, nothing the cache cannot return."""
    if body.get("n", 1) not in (1, None) or body.get("best_of") not in (None, 1):
        return False
    if any(body.get(name) not in (None, False, 0, [], {}) for name in BLOCKING):
        return False
    greedy = body.get("temperature", 1.0) == 0
    return greedy or body.get("seed") is not None


def query_text(body: dict[str, Any], chat: bool) -> str | None:
    """The text to embed: the prompt, or the last (user) chat message; None when
    the request has no such text."""
    if not chat:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return prompt if isinstance(prompt, str) and prompt.strip() else None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    text = message_text(last.get("content"))
    return text if last.get("role") == "user" and text and text.strip() else None


def message_text(content: Any) -> str | None:
    """A message's text (text parts joined), or None if it has anything else."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            return None
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def scope_of(body: dict[str, Any], chat: bool, model: str, authorization: str | None) -> str:
    """Digest of model, endpoint, tenant, sampling fields and chat history."""
    tenant = hashlib.sha256((authorization or "").encode()).hexdigest()
    params = {k: v for k, v in body.items()
              if k not in TEXT_FIELDS and k not in NOT_SHAPING and v is not None}
    history = [{k: m.get(k) for k in ("role", "content", "name")}
               for m in body.get("messages", [])[:-1]] if chat else []
    payload = {"model": model, "chat": chat, "tenant": tenant, "params": params,
               "history": history}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def request_key(body: dict[str, Any], chat: bool, model: str,
                authorization: str | None) -> tuple[str, str] | None:
    """(scope, text) of a request the cache may answer, or None."""
    if opted_out(body) or not is_reusable(body):
        return None
    text = query_text(body, chat)
    if text is None:
        return None
    return scope_of(body, chat, model, authorization), text
