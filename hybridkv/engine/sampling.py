"""Sampling parameters, per-request outputs and the sampler."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from hybridkv.kv_cache.checks import check_int


@dataclass(frozen=True)
class SamplingParams:
    """How to pick output tokens and when to stop.

    `temperature` 0 is greedy (`top_p`, `top_k` and `seed` are then unused);
    above 0 samples from softmax(logits / T), restricted to the `top_k` most
    likely tokens (0 or -1: all) and to the smallest set whose probability
    reaches `top_p`, with a generator seeded by `seed` (per request: the same
    seed and prompt give the same tokens). `ignore_eos` keeps generating past
    EOS. `stop`: strings that end the output (not included in the text; needs
    a tokenizer); `stop_token_ids`: tokens that end it (kept in the output
    ids). `n`: samples per prompt (`LLM.generate` returns n outputs per
    prompt, consecutive; sample i uses seed `seed + i`). Bad values raise
    ValueError naming the field.

    vLLM's extras, with vLLM's meaning (applied in this order, before
    temperature, top-k and top-p; greedy included):
    `min_tokens`: EOS and `stop_token_ids` cannot be sampled, and stop
    strings do not end the output, before that many output tokens.
    `logit_bias`: token id -> bias in [-100, 100] added to its logit (a dict;
    kept as a read-only `LogitBias` mapping so the params stay hashable).
    `repetition_penalty` (> 0): the logit of every token seen in the prompt
    or the output is divided by it when positive, multiplied when negative.
    `frequency_penalty`, `presence_penalty` (in [-2, 2], OpenAI's formula,
    output tokens only): logit -= frequency * count + presence * (count > 0).
    `logprobs`: None, or k in [0, 20]: each sampled token's logprob and rank
    plus the k most likely alternatives; `prompt_logprobs` the same for
    every prompt token after the first (such a request computes its whole
    prompt: it takes no prefix-cache hit itself). Logprobs are those of the
    RAW model distribution, log_softmax of the logits before penalties, bias
    and temperature (vLLM's default `logprobs_mode="raw_logprobs"`).
    `skip_special_tokens`: drop special tokens from the detokenized text.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    logit_bias: Mapping[int, float] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        check_int("SamplingParams.max_tokens", self.max_tokens, 1)
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, "
                             f"got {self.temperature!r}")
        if self.seed is not None:
            check_int("SamplingParams.seed", self.seed, -(1 << 63), (1 << 64) - 1, " or None")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be a number in (0, 1], "
                             f"got {self.top_p!r}")
        check_int("SamplingParams.top_k", self.top_k, -1)
        check_int("SamplingParams.n", self.n, 1)
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        object.__setattr__(self, "stop_token_ids", _stop_token_ids(self.stop_token_ids))
        self._check_extras()

    def _check_extras(self) -> None:
        rep = self.repetition_penalty
        if not _is_number(rep) or not 0 < rep < math.inf:
            raise ValueError(f"SamplingParams.repetition_penalty must be > 0, got {rep!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                raise ValueError(f"SamplingParams.{name} must be a number in [-2, 2], "
                                 f"got {value!r}")
        check_int("SamplingParams.min_tokens", self.min_tokens, 0, self.max_tokens,
                  " (at most max_tokens)")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                check_int(f"SamplingParams.{name}", getattr(self, name), 0, MAX_LOGPROBS,
                          " or None")
        if not isinstance(self.skip_special_tokens, bool):
            raise ValueError(f"SamplingParams.skip_special_tokens must be a bool, "
                             f"got {self.skip_special_tokens!r}")
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", LogitBias(self.logit_bias))

    @property
    def has_logits_processing(self) -> bool:
        """Whether anything changes the logits before sampling (greedy stays argmax
        of the raw logits otherwise)."""
        return bool(self.repetition_penalty != 1 or self.presence_penalty
                    or self.frequency_penalty or self.min_tokens or self.logit_bias)


MAX_LOGPROBS = 20  # the most alternatives `logprobs` / `prompt_logprobs` may ask for


class LogitBias(Mapping[int, float]):
    """A read-only, hashable token id -> bias map (what `SamplingParams.logit_bias`
    holds). ValueError naming the entry for an id that is no int >= 0 or a bias
    outside [-100, 100]."""

    def __init__(self, bias: object) -> None:
        if not isinstance(bias, Mapping):
            raise ValueError(f"SamplingParams.logit_bias must be a dict of token id -> "
                             f"bias, got {bias!r}")
        for token, value in bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"SamplingParams.logit_bias keys must be token ids "
                                 f"(ints >= 0), got {token!r}")
            if not _is_number(value) or not -100 <= value <= 100:
                raise ValueError(f"SamplingParams.logit_bias[{token}] must be a number in "
                                 f"[-100, 100], got {value!r}")
        self._items = tuple(sorted((int(t), float(v)) for t, v in bias.items()))
        self._map = dict(self._items)

    def __getitem__(self, token: int) -> float:
        return self._map[token]

    def __iter__(self) -> Iterator[int]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other.items())

    def __repr__(self) -> str:
        return f"LogitBias({self._map!r})"


class TokenLogprobs(NamedTuple):
    """Logprobs at one position: the chosen token's (sampled, or the prompt's
    token), its 1-based rank (how many tokens are at least as likely, itself
    included) and the `k` most likely tokens, most likely first.

    TokenLogprobs(token_id=7, logprob=-0.2, rank=1, top=((7, -0.2), (3, -2.1)))
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _stop_strings(stop: object) -> tuple[str, ...]:
    items = (stop,) if isinstance(stop, str) else stop
    if not isinstance(items, Sequence) or not all(isinstance(s, str) and s for s in items):
        raise ValueError(f"SamplingParams.stop must be a non-empty string or a list of them, "
                         f"got {stop!r}")
    return tuple(items)


def _stop_token_ids(ids: object) -> tuple[int, ...]:
    if not isinstance(ids, Sequence) or isinstance(ids, str) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ValueError(f"SamplingParams.stop_token_ids must be a list of token ids >= 0, "
                         f"got {ids!r}")
    return tuple(ids)


def find_stop_string(text: str, stop: Sequence[str]) -> tuple[int, str] | None:
    """(position, string) of the stop string that occurs first in `text`, or None."""
    best: tuple[int, str] | None = None
    for s in stop:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    return best


@dataclass
class RequestMetrics:
    """When a request arrived, got its first output token and finished
    (`time.perf_counter()` seconds)."""

    arrival_time: float
    first_token_time: float
    finished_time: float

    @property
    def time_to_first_token(self) -> float:
        """Seconds from arrival (the `generate` call) to the first sampled token."""
        return self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    """What `LLM.generate` returns for one prompt."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    # "stop" (EOS, a stop string or token), "length", "abort", "error" (see `error`)
    finish_reason: str | None = None
    text: str | None = None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    metrics: RequestMetrics | None = None
    # of num_cached_tokens (every reused prompt token), those a KV store supplied
    num_external_cached_tokens: int = 0
    error: str | None = None  # why this request failed alone (finish_reason "error")
    logprobs: list[TokenLogprobs] | None = None  # one per output token, when asked
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # first entry None, when asked


class Sampler:
    """Greedy or seeded temperature sampling, one generator per request."""

    def __init__(self, default_seed: int = 0) -> None:
        self.default_seed = default_seed
        self._generators: dict[str, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, request_id: str, params: SamplingParams,
               salt: int = 0) -> int:
        """Pick one token from `logits` [vocab] for `request_id`."""
        if params.temperature == 0:
            return int(torch.argmax(logits).item())
        gen = self._generators.get(request_id)
        if gen is None:
            seed = params.seed if params.seed is not None else self.default_seed + salt
            gen = self._generators[request_id] = torch.Generator().manual_seed(seed)
        scaled = _top_k_top_p(logits.float() / params.temperature, params.top_k, params.top_p)
        probs = torch.softmax(scaled, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen).item())

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)


def _top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """`logits` [vocab] with every token outside the top-k / top-p set at -inf."""
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the more likely tokens
        drop = before >= top_p  # the most likely token is always kept (before = 0)
        logits = logits.clone()
        logits[order[drop]] = -math.inf
    return logits
