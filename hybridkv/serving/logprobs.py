"""The engine's per-token log-probabilities in OpenAI's two response shapes.

The engine gives, per sampled token, a `TokenLogprobs(token_id, logprob,
rank, top)` with `top` the k most likely tokens, most likely first. Here:

- completions (`logprobs: k`): `{"tokens": [...], "token_logprobs": [...],
  "top_logprobs": [{text: logprob}, ...], "text_offset": [...]}`, where each
  `top_logprobs` entry holds the k alternatives plus the sampled token (as
  vLLM does; tokens with the same text share the key of the likeliest), and
  `text_offset` is where each token's text starts in the choice's text
  (after the echoed prompt, when `echo`);
- chat (`logprobs: true, top_logprobs: k`): `{"content": [{"token",
  "logprob", "bytes", "top_logprobs": [k x {"token", "logprob", "bytes"}]}]}`.

A token's text is `tokenizer.decode([id])` ("token_id:N" without a
tokenizer); a log-probability of -inf is written as -9999.0, since JSON has
no infinity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hybridkv.serving.protocol import (
    ChatLogprobs,
    CompletionLogprobs,
    TokenLogprob,
    TopLogprob,
)

MIN_LOGPROB = -9999.0


def token_text(tokenizer: Any, token_id: int) -> str:
    """The text of one token, as the logprobs fields show it."""
    if tokenizer is None:
        return f"token_id:{token_id}"
    return str(tokenizer.decode([token_id]))


def finite(logprob: float) -> float:
    """`logprob` as JSON can carry it (-inf and NaN become -9999.0)."""
    return logprob if math.isfinite(logprob) else MIN_LOGPROB


def completion_logprobs(tokenizer: Any, token_ids: Sequence[int], entries: Sequence[Any],
                        num_top: int, text_offset: int = 0) -> CompletionLogprobs:
    """OpenAI's completions logprobs of `token_ids`; `entries[i]` is token i's
    TokenLogprobs (None: no log-probability, as for the first prompt token).

    Tokens [5, 9] ("a", "b") with logprobs -0.1, -2.3 and one alternative
    each give tokens ["a", "b"], token_logprobs [-0.1, -2.3], top_logprobs
    [{"a": -0.1}, {"c": -0.5, "b": -2.3}], text_offset [0, 1].
    """
    out = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries):
        text = token_text(tokenizer, token_id)
        out.tokens.append(text)
        out.text_offset.append(text_offset)
        text_offset += len(text)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(finite(entry.logprob))
        top: dict[str, float] = {}
        for t, lp in entry.top[:num_top]:  # most likely first: it keeps a shared text
            top.setdefault(token_text(tokenizer, t), finite(lp))
        top.setdefault(text, finite(entry.logprob))
        out.top_logprobs.append(top)
    return out


def next_offset(logprobs: CompletionLogprobs) -> int:
    """The text offset just past the last token of `logprobs`."""
    if not logprobs.tokens:
        return 0
    return logprobs.text_offset[-1] + len(logprobs.tokens[-1])


def chat_logprobs(tokenizer: Any, entries: Sequence[Any], num_top: int) -> ChatLogprobs:
    """OpenAI's chat logprobs: one entry per output token with `num_top` alternatives."""
    return ChatLogprobs(content=[TokenLogprob(
        **_top(tokenizer, entry.token_id, entry.logprob).model_dump(),
        top_logprobs=[_top(tokenizer, t, lp) for t, lp in entry.top[:num_top]])
        for entry in entries])


def _top(tokenizer: Any, token_id: int, logprob: float) -> TopLogprob:
    text = token_text(tokenizer, token_id)
    return TopLogprob(token=text, logprob=finite(logprob), bytes=list(text.encode("utf-8")))
