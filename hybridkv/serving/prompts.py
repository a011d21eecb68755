"""From request bodies to token ids, checked against the model's limits.

Text goes through `tokenizer.encode`; chat messages through
`hybridkv.engine.chat.render_chat` (the tokenizer's chat template with
`add_generation_prompt=True`, then `encode(..., add_special_tokens=False)`),
exactly as `LLM.chat` renders them. Without a tokenizer only
token-id prompts work; text and chat are refused naming `prompt` /
`messages`. Every problem is an `APIError` naming the field.

Text longer than `max_prompt_chars` characters is refused before it is
tokenized (`--max-prompt-chars`): tokenizing megabytes of text holds a core
for seconds, and no such text fits the context anyway.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hybridkv.engine.chat import render_chat
from hybridkv.serving.errors import APIError, bad_request
from hybridkv.serving.protocol import MAX_PROMPTS, ChatMessage

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 512  # cap on the remaining context when chat sets no limit
CHARS_PER_TOKEN_LIMIT = 32  # default --max-prompt-chars: this many per context token
MIN_PROMPT_CHARS = 1 << 16


def default_max_prompt_chars(max_model_len: int) -> int:
    """Characters of text a prompt may have by default (far more than fit the context)."""
    return max(MIN_PROMPT_CHARS, CHARS_PER_TOKEN_LIMIT * max_model_len)


class PromptBuilder:
    """Tokenizes and checks prompts for one model."""

    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int,
                 max_prompt_chars: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_prompt_chars = max_prompt_chars or default_max_prompt_chars(max_model_len)

    # ---- size checks (cheap: before any tokenizing) --------------------------

    def check_prompt_chars(self, prompt: Any) -> None:
        """400 naming `prompt` when its text is longer than `max_prompt_chars`."""
        texts = [prompt] if isinstance(prompt, str) else \
            [p for p in prompt if isinstance(p, str)] if isinstance(prompt, list) else []
        self._check_chars(sum(map(len, texts)), "prompt")

    def check_chat_chars(self, messages: Sequence[ChatMessage]) -> None:
        """400 naming `messages` when their text is longer than `max_prompt_chars`."""
        total = 0
        for m in messages:
            if isinstance(m.content, str):
                total += len(m.content)
            elif m.content is not None:
                total += sum(len(part.text) for part in m.content)
        self._check_chars(total, "messages")

    def _check_chars(self, num_chars: int, param: str) -> None:
        if num_chars > self.max_prompt_chars:
            raise bad_request(f"{param}: {num_chars} characters of text are more than this "
                              f"server tokenizes ({self.max_prompt_chars}, set by "
                              f"--max-prompt-chars)", param)

    # ---- inputs --------------------------------------------------------------

    def completion_prompts(self, prompt: Any) -> list[list[int]]:
        """Token ids of each prompt of a /v1/completions `prompt` field."""
        if isinstance(prompt, str) or _is_token_ids(prompt):
            return [self._one(prompt, "prompt")]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if len(prompt) > MAX_PROMPTS:
            raise bad_request(f"prompt has {len(prompt)} prompts; at most {MAX_PROMPTS} per "
                              f"request", "prompt")
        return [self._one(p, f"prompt[{i}]") for i, p in enumerate(prompt)]

    def _one(self, prompt: str | list[int], param: str) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise bad_request(f"{param} must not be empty", param)
            tokenizer = self._require_tokenizer(param)
            try:
                return list(tokenizer.encode(prompt))
            except Exception as err:  # noqa: BLE001 - e.g. a lone surrogate
                raise bad_request(f"{param}: the text cannot be tokenized: {err}", param) \
                    from None
        return self.check_token_ids(prompt, param)

    def check_token_ids(self, ids: list[int], param: str) -> list[int]:
        if not ids:
            raise bad_request(f"{param} must not be empty", param)
        if min(ids) < 0 or max(ids) >= self.vocab_size:  # C loops; the Python one names it
            i, token = next((i, t) for i, t in enumerate(ids)
                            if not 0 <= t < self.vocab_size)
            raise bad_request(f"{param}[{i}]: token id {token} is outside the vocabulary "
                              f"[0, {self.vocab_size})", param)
        return ids

    def chat_prompt(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Token ids of chat `messages`, rendered as `LLM.chat` renders them
        (`hybridkv.engine.chat.render_chat`: the tokenizer's chat template, then
        encoded without added special tokens)."""
        self._require_tokenizer("messages")
        try:
            ids = render_chat(self.tokenizer, [m.to_template() for m in messages])
        except ValueError as err:
            found = re.search(r"messages\[\d+\](\.\w+)?", str(err))
            raise bad_request(str(err), found.group(0) if found else "messages") from None
        except Exception as err:  # noqa: BLE001 - the chat template refused these messages
            raise bad_request(f"messages: the chat template failed: {err}", "messages") \
                from None
        if not ids:
            raise bad_request("messages render to an empty prompt", "messages")
        return ids

    def _require_tokenizer(self, param: str) -> Any:
        if self.tokenizer is None:
            raise bad_request(f"{param}: this model has no tokenizer, so text cannot be "
                              f"tokenized; send token ids", param)
        return self.tokenizer

    # ---- limits --------------------------------------------------------------

    def max_tokens(self, requested: int | None, prompt_len: int, *, prompt_param: str,
                   limit_param: str, default: int) -> int:
        """The output limit of one prompt: `requested`, or `default` capped by the context."""
        room = self.max_model_len - prompt_len
        if room < 1:
            raise bad_request(f"{prompt_param}: this model's maximum context length is "
                              f"{self.max_model_len} tokens and the prompt has {prompt_len}, "
                              f"leaving no room for an output", prompt_param)
        if requested is None:
            return min(default, room)
        if requested > room:
            raise bad_request(f"{limit_param}: this model's maximum context length is "
                              f"{self.max_model_len} tokens; you requested {requested} output "
                              f"tokens with a {prompt_len}-token prompt (at most {room})",
                              limit_param)
        return requested

    def check_stop(self, stop: str | list[str] | None) -> tuple[str, ...]:
        items = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if items and self.tokenizer is None:
            raise bad_request("stop: stop strings need a tokenizer, which this model lacks; "
                              "use stop_token_ids", "stop")
        return items


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and (not value or isinstance(value[0], int))


def not_found_model(name: str, served: str) -> APIError:
    return APIError(404, f"the model {name!r} does not exist; this server serves {served!r}",
                    "model", "model_not_found")
