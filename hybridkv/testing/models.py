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
