"""Sampling parameters, per-request outputs and the sampler."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybridkv.kv_cache.checks import check_int


@dataclass(frozen=True)
class SamplingParams:
    """How to pick output tokens.

    `temperature` 0 is greedy; above 0 samples from softmax(logits / T) with
    a generator seeded by `seed` (per request: the same seed and prompt give
    the same tokens). `ignore_eos` keeps generating past EOS.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        check_int("SamplingParams.max_tokens", self.max_tokens, 1)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float) \
                or not self.temperature >= 0 or self.temperature == float("inf"):
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, "
                             f"got {self.temperature!r}")
        if self.seed is not None:
            check_int("SamplingParams.seed", self.seed, note=" or None")


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
    finish_reason: str | None = None  # "stop" (EOS) or "length" (max_tokens)
    text: str | None = None
    metrics: RequestMetrics | None = None


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
        probs = torch.softmax(logits.float() / params.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen).item())

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
