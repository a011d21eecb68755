"""Model helpers for tests: make recurrent state matter."""

from __future__ import annotations

import torch
from torch import nn


def slow_decay(model: nn.Module, low: float = -7.0, high: float = -3.0, seed: int = 0) -> None:
    """Set every Mamba `A_log` to values in [low, high], so A = -exp(A_log) is near 0 and
    states fade slowly over thousands of tokens: a dropped or wrong initial state then
    changes the logits visibly instead of being forgotten within a few tokens."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log"):
                param.copy_(low + (high - low) * torch.rand(param.shape, generator=generator))


def hf_greedy_no_cache(model: nn.Module, prompt: list[int], num_tokens: int) -> list[int]:
    """The reference decode: `num_tokens` greedy tokens, each from Hugging Face's forward
    over the whole sequence so far with no cache (never its cached continuation)."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(num_tokens):
            logits = model(torch.tensor([tokens]), use_cache=False).logits[0, -1]
            tokens.append(int(torch.argmax(logits)))
    return tokens[len(prompt):]
