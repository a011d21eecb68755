"""Rotary position embeddings (RoPE) built from a Hugging Face rope config.

A `RotaryEmbedding` holds the inverse frequencies of one layer type and the
factor that scales cos/sin (YaRN's attention factor, 1 otherwise). Positions
are absolute token positions, so the same table serves prefill chunks, decode
steps and several sequences in one flattened batch.

Two layouts of the rotated pairs exist in the families we run:

- halves (`interleaved=False`): dimension i pairs with i + D/2 (Gemma, Qwen2,
  Mistral, gpt-oss);
- adjacent pairs (`interleaved=True`): dimension 2i pairs with 2i + 1
  (Llama 4, written there as a complex product).

Supported `rope_type`s: default, linear, llama3, yarn. Types whose
frequencies depend on the current sequence length (dynamic, longrope) are
refused with ValueError: their tables would change between prefill chunks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, eq=False)
class RotaryEmbedding:
    """Inverse frequencies of one layer type and how to apply them.

    `inv_freq`: float32 [head_dim // 2]. `attention_scaling` multiplies cos
    and sin. `interleaved` selects the pair layout (see module docstring).
    """

    inv_freq: torch.Tensor
    attention_scaling: float = 1.0
    interleaved: bool = False

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of `positions` (int [T]), each float32 [T, head_dim // 2]."""
        inv_freq = self.inv_freq.to(device=positions.device, dtype=torch.float32)
        angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
        return angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate `x` [T, H, D] by the angles of `cos_sin` ([T, D/2] each)."""
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, D/2]
        if self.interleaved:
            return _rotate_pairs(x, cos, sin)
        return _rotate_halves(x, cos, sin)


def _rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), computed in x's dtype
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D] viewed as [T, H, D/2, 2]; each pair is a complex number, computed in float32
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]  # [T, H, D/2]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def rotary_from_params(params: Mapping[str, Any], head_dim: int, *,
                       max_position_embeddings: int | None = None,
                       interleaved: bool = False) -> RotaryEmbedding:
    """Build the table for one rope parameter dict (one entry of `config.rope_parameters`).

    Raises ValueError for an unsupported `rope_type` or a partial rotary factor.
    Example: `rotary_from_params({"rope_type": "default", "rope_theta": 1e4}, 64)`.
    """
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if float(params.get("partial_rotary_factor") or 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    theta = float(params["rope_theta"])
    if rope_type == "yarn":
        inv_freq, scaling = _yarn(params, theta, head_dim, max_position_embeddings)
    else:
        inv_freq, scaling = _base_inv_freq(theta, head_dim), 1.0
        if rope_type == "linear":
            inv_freq = inv_freq / float(params["factor"])
        elif rope_type == "llama3":
            inv_freq = _llama3(inv_freq, params)
    return RotaryEmbedding(inv_freq, float(scaling), interleaved)


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """theta ** (-2i / dim) for i < dim / 2, float32 [dim // 2]."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (theta ** exponents)


def _llama3(inv_freq: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, a smooth ramp between."""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(params: Mapping[str, Any], theta: float, dim: int,
          max_position_embeddings: int | None) -> tuple[torch.Tensor, float]:
    """YaRN: interpolated low frequencies, extrapolated high ones, a linear ramp between."""
    original = float(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError("yarn rope without 'factor' needs max_position_embeddings")
        factor = max_position_embeddings / original
    factor = float(factor)
    scaling = params.get("attention_factor")
    if scaling is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        scaling = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
                   if mscale and mscale_all else _yarn_mscale(factor))
    low, high = _yarn_correction_range(params, theta, dim, original)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(torch.float32) / dim)  # [D/2]
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # 1 where the original frequency is kept
    interpolated, kept = 1.0 / (factor * pos_freqs), 1.0 / pos_freqs
    return interpolated * (1 - extrapolation) + kept * extrapolation, float(scaling)


def _yarn_correction_range(params: Mapping[str, Any], theta: float, dim: int,
                           original: float) -> tuple[float, float]:
    """Dimension indices where the ramp between extrapolation and interpolation runs."""
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def dim_of(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)
