"""RMSNorm, residual add and rotary embedding in one C call each, with the torch reference.

Between its matrix products a decoder layer normalizes, adds to the residual stream
and rotates q and k: at decode sizes (8 rows of a few hundred floats) each torch call
costs microseconds of dispatch for nanoseconds of arithmetic, and `torch.rms_norm` on
CPU is six calls. `_norm_rope.c` does each of these steps in one pass:

- `rms_norm(x, w, eps)`: `x / sqrt(mean(x^2) + eps) * w` over the last dimension;
- `residual_norm(h, x, post, pre)`: `h + rms_norm(x, *post)` (or `h + x` when `post` is
  None), and `rms_norm` of that sum by `pre` (None: skipped), as Gemma's sandwich norms
  and the pre-norm decoders need them;
- `norm_rope_qk(q, k, cos, sin, q_norm, k_norm)`: an optional RMSNorm of each head, then
  the rotary rotation of the halves layout, on q and k in place.

Weights are the effective ones (`offset + weight` for Gemma's norms), float32, `[D]`.
Every function takes the C path only for float32 CPU tensors laid out as it expects and
otherwise runs the torch reference (the `*_reference` functions, which the tests also
compare against); both round each product and sum alike, except the order in which a
row's squares are summed.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

NormWeight = tuple[torch.Tensor, float]  # (effective weight [D], eps)


def _load() -> Any:
    try:
        return importlib.import_module("hybridkv._native._norm_rope")
    except ImportError:
        return None


_norm_rope = _load()


def _rows(x: torch.Tensor) -> tuple[int, int] | None:
    """(rows, row stride) of x seen as rows of its last dimension, or None when the C
    kernel cannot address it (not float32 on CPU, or rows not evenly strided)."""
    if _norm_rope is None or x.dtype != torch.float32 or x.device.type != "cpu" \
            or x.dim() < 2 or x.stride(-1) != 1:
        return None
    if x.dim() == 2:
        return x.shape[0], x.stride(0)
    if x.is_contiguous():
        return x.numel() // x.shape[-1], x.shape[-1]
    return None


def _fits(weight: torch.Tensor, dim: int) -> bool:
    return (weight.dtype == torch.float32 and weight.device.type == "cpu"
            and weight.is_contiguous() and weight.shape == (dim,))


def rms_norm_reference(x: torch.Tensor, norm: NormWeight) -> torch.Tensor:
    weight, eps = norm
    return torch.rms_norm(x, (weight.shape[0],), weight, eps)


def rms_norm(x: torch.Tensor, norm: NormWeight) -> torch.Tensor:
    """RMSNorm of x `[..., D]` over its last dimension, as a new tensor."""
    weight, eps = norm
    rows = _rows(x)
    if rows is None or not _fits(weight, x.shape[-1]):
        return rms_norm_reference(x, norm)
    out = torch.empty(x.shape, dtype=x.dtype)
    _norm_rope.norm(x.data_ptr(), out.data_ptr(), weight.data_ptr(), rows[0], x.shape[-1],
                    rows[1], eps)
    return out


def residual_norm_reference(hidden: torch.Tensor, x: torch.Tensor, post: NormWeight | None,
                            pre: NormWeight | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden = hidden + (x if post is None else rms_norm_reference(x, post))
    return hidden, None if pre is None else rms_norm_reference(hidden, pre)


def residual_norm(hidden: torch.Tensor, x: torch.Tensor, post: NormWeight | None,
                  pre: NormWeight | None, *, in_place: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(`hidden + norm_post(x)`, `norm_pre` of that sum) for hidden and x `[T, D]`; a norm
    given as None is skipped (a plain add; no second output). `in_place`: the sum is
    written over `hidden` (which the caller owns) where the C kernel runs."""
    rows = _rows(x)
    dim = x.shape[-1]
    if rows is None or x.dim() != 2 or hidden.shape != x.shape or hidden.dtype != x.dtype \
            or hidden.device != x.device or not hidden.is_contiguous() \
            or any(n is not None and not _fits(n[0], dim) for n in (post, pre)):
        return residual_norm_reference(hidden, x, post, pre)
    out = hidden if in_place else torch.empty(hidden.shape, dtype=hidden.dtype)
    y = None if pre is None else torch.empty(hidden.shape, dtype=hidden.dtype)
    _norm_rope.residual_norm(
        hidden.data_ptr(), x.data_ptr(), None if post is None else post[0].data_ptr(),
        None if pre is None else pre[0].data_ptr(), out.data_ptr(),
        None if y is None else y.data_ptr(), rows[0], dim, rows[1],
        1.0 if post is None else post[1], 1.0 if pre is None else pre[1])
    return out, y


def rotate_halves_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                            ) -> torch.Tensor:
    """x `[T, H, D]` rotated by cos, sin `[T, D/2]`: (x1, x2) -> (x1 cos - x2 sin,
    x2 cos + x1 sin)."""
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _heads_fit(x: torch.Tensor, tokens: int) -> bool:
    """x `[T, H, D]`, float32 on CPU, heads of D adjacent floats, token rows strided."""
    return (x.dim() == 3 and x.shape[0] == tokens and x.dtype == torch.float32
            and x.device.type == "cpu" and x.stride(2) == 1 and x.stride(1) == x.shape[2])


def norm_rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 q_norm: NormWeight | None = None, k_norm: NormWeight | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """q `[T, Hq, D]` and k `[T, Hkv, D]` RMSNormed per head (where a norm is given) and
    rotated (halves layout) by cos, sin `[T, D/2]`, in place; None (nothing changed) when
    the C kernel cannot take them: the caller then runs the torch path. Both norms must
    share one eps when both are given."""
    tokens, dim = q.shape[0], q.shape[-1]
    if _norm_rope is None or not (_heads_fit(q, tokens) and _heads_fit(k, tokens)) \
            or k.shape[2] != dim or dim % 2:
        return None
    for table in (cos, sin):
        if table.dtype != torch.float32 or table.device.type != "cpu" \
                or not table.is_contiguous() or table.shape != (tokens, dim // 2):
            return None
    norms = [n for n in (q_norm, k_norm) if n is not None]
    if any(not _fits(n[0], dim) for n in norms) or len({n[1] for n in norms}) > 1:
        return None
    eps = norms[0][1] if norms else 1.0
    _norm_rope.qk_norm_rope(
        q.data_ptr(), k.data_ptr(), None if q_norm is None else q_norm[0].data_ptr(),
        None if k_norm is None else k_norm[0].data_ptr(), cos.data_ptr(), sin.data_ptr(),
        tokens, q.shape[1], k.shape[1], dim, q.stride(0), k.stride(0), eps)
    return q, k
