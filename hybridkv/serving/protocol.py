"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Requests are parsed strictly: a wrong type is an error, not a coercion, and
an unknown field is refused (OpenAI's own API does the same), so a typo never
passes silently. OpenAI's sampling fields (`logprobs`, `top_logprobs`,
`echo`, `presence_penalty`, `frequency_penalty`, `logit_bias`, ...) and
vLLM's extras (`repetition_penalty`, `min_tokens`, `top_k`, `stop_token_ids`,
`ignore_eos`, `skip_special_tokens`, `return_token_ids`, `cache_salt`) are
honoured with vLLM's meaning. Fields this server cannot honour (`tools`,
`response_format` other than text, `min_p` above 0, ...) are a 400 naming
them (see `requests_unsupported`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

MAX_N = 16  # choices per request
MAX_PROMPTS = 64  # prompts in one completion request
MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's and vLLM's default limit)
MAX_LOGIT_BIAS = 100.0  # |bias| (OpenAI's range)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class SamplingFields(BaseModel):
    """The options completions and chat share."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    ignore_eos: bool = False
    return_token_ids: bool = False
    user: str | None = None
    semantic_cache: bool | None = None  # false: never answered from the semantic cache
    skip_special_tokens: bool = True
    repetition_penalty: float = Field(default=1.0, gt=0)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    min_tokens: int = Field(default=0, ge=0)
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None
    min_p: float = 0.0
    # fields this server cannot honour: a 400 naming them unless absent or neutral
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else value or []
        if len(items) > 8 or not all(items):
            raise ValueError("must be a non-empty string or a list of at most 8 of them")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(t < 0 for t in value):
            raise ValueError("token ids must be >= 0")
        return value

    @field_validator("repetition_penalty", "presence_penalty", "frequency_penalty",
                     "min_p", mode="before")
    @classmethod
    def _finite_number(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # JSON `1` for a float field
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise ValueError(f"key {key!r} is not a token id (a string of digits)")
            if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
                raise ValueError(f"bias {bias!r} of token {key} is outside "
                                 f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
        return value

    @field_validator("min_p")
    @classmethod
    def _min_p(cls, value: float) -> float:
        if value != 0:
            raise ValueError("is not supported by this server (only 0)")
        return value

    @field_validator("tools", "tool_choice", "functions", "function_call", "guided_json",
                     "guided_regex", "guided_choice", "guided_grammar")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value not in (None, [], "none"):
            raise ValueError("is not supported by this server (no tool calling or guided "
                             "decoding)")
        return value

    @field_validator("parallel_tool_calls")
    @classmethod
    def _parallel_tool_calls(cls, value: Any) -> Any:
        if value not in (None, True, False):
            raise ValueError("must be a bool")
        return value

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: Any) -> Any:
        if value is not None and value != {"type": "text"}:
            raise ValueError("only {'type': 'text'} is supported by this server (no JSON "
                             "mode or schema-guided decoding)")
        return value

    @property
    def logit_bias_ids(self) -> dict[int, float] | None:
        """`logit_bias` with int keys (OpenAI sends them as strings)."""
        if not self.logit_bias:
            return None
        return {int(k): v for k, v in self.logit_bias.items()}

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value != info.data.get("n", 1):
            raise ValueError("is not supported by this server (only equal to n)")
        return value


PromptInput = str | list[int] | list[str] | list[list[int]]


class CompletionRequest(SamplingFields):
    """POST /v1/completions: `prompt` is a string, token ids, or a list of either.

    `logprobs` k: each output token's log-probability and the k most likely
    alternatives; `echo`: the prompt (and with `logprobs`, its
    log-probabilities) before the output.
    """

    prompt: PromptInput
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: None = None

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat turn. The role is checked where chat is rendered
    (`hybridkv.engine.chat`: system, user, assistant; `developer` is rendered
    as `system`, as OpenAI's newer models name it); other keys are ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None

    def to_template(self) -> dict[str, Any]:
        """The message as `hybridkv.engine.chat.render_chat` takes it."""
        message = self.model_dump(include={"role", "content"}, exclude_none=True)
        if message["role"] == "developer":
            message["role"] = "system"
        return message


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions. `logprobs` true: each output token's
    log-probability and its `top_logprobs` most likely alternatives."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs set to true")
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(BaseModel):
    """POST /tokenize: a text `prompt` or chat `messages` (rendered as chat does)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt / messages")
        return self


# ---- responses ---------------------------------------------------------------

class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(BaseModel):
    """OpenAI's completions shape: one entry per token (`None` for the first
    prompt token, which has no log-probability)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """OpenAI's chat shape: one entry per output token."""

    content: list[TokenLogprob]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))
