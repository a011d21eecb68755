"""One cached answer and what it answers."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class Entry:
    """A stored response. `scope` is the tenant/model/parameters digest, `key`
    the normalised request text (the exact-match layer), `text` the request as
    sent (for the lexical checks), `vector` its unit embedding [dim] float32."""

    id: int
    scope: str
    key: str
    text: str
    vector: np.ndarray
    answer: str
    finish_reason: str = "stop"
    completion_tokens: int | None = None
    created: float = 0.0

    def to_json(self) -> str:
        """Everything but the vector (Redis keeps the vector in the stream)."""
        return json.dumps({"id": self.id, "scope": self.scope, "key": self.key,
                           "text": self.text, "answer": self.answer,
                           "finish_reason": self.finish_reason,
                           "completion_tokens": self.completion_tokens,
                           "created": self.created})

    @classmethod
    def from_json(cls, raw: str | bytes, vector: np.ndarray) -> Entry:
        """The entry `to_json` wrote; ValueError/KeyError when `raw` is damaged."""
        data = json.loads(raw)
        return cls(id=int(data["id"]), scope=str(data["scope"]), key=str(data["key"]),
                   text=str(data["text"]), vector=vector, answer=str(data["answer"]),
                   finish_reason=str(data["finish_reason"]),
                   completion_tokens=data["completion_tokens"],
                   created=float(data["created"]))
