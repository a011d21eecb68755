"""Output text of one choice, built as tokens arrive.

The text is always `tokenizer.decode(all output ids, skip_special_tokens=...)`
(the request's `skip_special_tokens`, true by default) cut before the stop
string that ended the request. While a request runs,
the pieces hold back an incomplete UTF-8 character (decoded as U+FFFD) and
the last `len(longest stop string) - 1` characters, which a stop string may
still claim (the engine stops as soon as one is complete), so for tokenizers
whose decoding only appends as tokens arrive (byte-level BPE) the streamed
pieces join to exactly the non-streamed text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"


def final_text(tokenizer: Any, token_ids: Sequence[int], stop_reason: int | str | None,
               skip_special_tokens: bool = True) -> str:
    """The text of a finished choice ("" without a tokenizer)."""
    if tokenizer is None:
        return ""
    text = tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
    if isinstance(stop_reason, str):
        cut = text.find(stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text


class IncrementalText:
    """Turns token deltas of one choice into text deltas."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (),
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.sent = 0  # characters already returned
        self.hold = max((len(s) for s in stop), default=1) - 1

    def push(self, token_ids: Sequence[int], finished: bool = False,
             stop_reason: int | str | None = None) -> str:
        """The new text after `token_ids`; everything left when `finished`."""
        self.token_ids.extend(token_ids)
        if self.tokenizer is None:
            return ""
        if finished:
            text = final_text(self.tokenizer, self.token_ids, stop_reason,
                              self.skip_special_tokens)
        else:
            text = self.tokenizer.decode(self.token_ids,
                                         skip_special_tokens=self.skip_special_tokens)
            text = text[:len(text) - self.hold] if self.hold else text
            text = text.rstrip(REPLACEMENT)
        if len(text) <= self.sent:
            return ""
        piece = text[self.sent:]
        self.sent = len(text)
        return piece
