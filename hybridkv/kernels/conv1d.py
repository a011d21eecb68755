"""Depthwise causal conv1d of a Mamba layer, with its rolling input state.

The conv state of a sequence is the last ``width - 1`` inputs it has seen,
``[batch, dim, width - 1]`` (oldest first), zero before the first token. The
arguments follow the ``causal_conv1d`` package so that a CUDA build can take
over (see ``mamba_gpu``), and two things are added for prefix caching:

- the span starts from a given conv state (``initial_states``), and
- ``emit_positions`` asks for the conv state after chosen numbers of tokens
  of the span (the block boundaries to checkpoint).

This module also holds the two pieces the scan kernels share:
``check_emit_positions`` and the ``SpanOutput`` result.

Example: width 4, span of 40 tokens, ``emit_positions=[16, 32]`` returns the
states made of inputs ``13..15`` and ``29..31`` of the span, plus the final
state made of inputs ``37..39``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

ACTIVATIONS = (None, "silu", "swish")


class SpanOutput(NamedTuple):
    """Result of a kernel run over a span with ``emit_positions``.

    ``out`` is the kernel output, ``final_state`` the state after the whole
    span and ``emitted_states`` the states after each emit position, stacked
    on dim 1: ``[batch, len(emit_positions), *state_shape]``.
    """

    out: torch.Tensor
    final_state: torch.Tensor
    emitted_states: torch.Tensor


def check_emit_positions(emit_positions: Sequence[int] | None, seqlen: int) -> list[int]:
    """Return ``emit_positions`` as a list after checking it against a span.

    Positions count processed tokens of the span: ``0`` is the state the span
    starts from, ``seqlen`` the final state. They must be ints, strictly
    increasing and within ``[0, seqlen]``; ``None`` means none.
    Raises ValueError otherwise, e.g. ``[32, 16]`` or ``[41]`` for 40 tokens.
    """
    if emit_positions is None:
        return []
    positions = [_as_int(pos) for pos in emit_positions]
    for pos in positions:
        if not 0 <= pos <= seqlen:
            raise ValueError(f"emit position {pos} is outside [0, {seqlen}] for this span")
    if any(b <= a for a, b in zip(positions, positions[1:])):
        raise ValueError(f"emit_positions must be strictly increasing, got {positions}")
    return positions


def _as_int(pos) -> int:
    if isinstance(pos, bool):
        raise ValueError(f"emit_positions must hold ints, got {pos!r}")
    try:
        return operator.index(pos)
    except TypeError:
        raise ValueError(f"emit_positions must hold ints, got {pos!r}") from None


def _check_activation(activation: str | None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def _check_weight(weight: torch.Tensor, bias: torch.Tensor | None, dim: int) -> None:
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise ValueError(f"weight must be [dim={dim}, width], got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (dim,):
        raise ValueError(f"bias must be [dim={dim}], got {tuple(bias.shape)}")


def _activate(out: torch.Tensor, activation: str | None) -> torch.Tensor:
    return out if activation is None else F.silu(out)


def _conv_window(xx: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """Valid depthwise conv over ``xx`` (already prefixed with width-1 inputs)."""
    # xx: [batch, dim, width - 1 + seqlen] -> out: [batch, dim, seqlen]
    w = weight.float().unsqueeze(1)  # [dim, 1, width]
    b = None if bias is None else bias.float()
    return F.conv1d(xx, w, b, groups=weight.shape[0])


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    emit_positions: Sequence[int] | None = None,
):
    """Causal depthwise conv over a span, starting from ``initial_states``.

    x: ``[batch, dim, seqlen]``; weight: ``[dim, width]``; bias: ``[dim]``;
    initial_states: ``[batch, dim, width - 1]`` (zeros when ``None``);
    activation: ``None``, ``"silu"`` or ``"swish"``. ``seq_idx`` (packed
    sequences) is not supported: run one call per sequence.
    Returns ``out`` ``[batch, dim, seqlen]`` in x's dtype, or
    ``(out, final_states)`` when ``return_final_states``, as the package
    does; ``final_states_out`` is filled too when given. With
    ``emit_positions`` it returns ``SpanOutput(out, final_states,
    emitted_states)``, emitted states ``[batch, E, dim, width - 1]``.
    Raises ValueError for inconsistent shapes or emit positions.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [batch, dim, seqlen], got {tuple(x.shape)}")
    if seq_idx is not None:
        raise ValueError("seq_idx (packed sequences) is not supported; run one call per sequence")
    batch, dim, seqlen = x.shape
    _check_weight(weight, bias, dim)
    _check_activation(activation)
    positions = check_emit_positions(emit_positions, seqlen)
    state_len = weight.shape[1] - 1
    if initial_states is None:
        initial_states = x.new_zeros(batch, dim, state_len)
    if tuple(initial_states.shape) != (batch, dim, state_len):
        raise ValueError(
            f"initial_states must be [batch, dim, width - 1] = {(batch, dim, state_len)}, "
            f"got {tuple(initial_states.shape)}"
        )
    xx = torch.cat([initial_states.to(x.dtype), x], dim=-1)  # [batch, dim, w-1+L]
    out = _activate(_conv_window(xx.float(), weight, bias), activation).to(x.dtype)
    final, emitted = conv_states(xx, state_len, positions)
    if final_states_out is not None:
        final_states_out.copy_(final)
    if emit_positions is not None:
        return SpanOutput(out, final, emitted)
    return (out, final) if return_final_states else out


def conv_states(xx: torch.Tensor, state_len: int, positions: list[int]):
    """Final and emitted conv states of a span, read off its inputs.

    xx: the start state followed by the span, ``[batch, dim, state_len + L]``.
    The state after ``k`` tokens is ``xx[..., k : k + state_len]``. Returns
    ``(final [batch, dim, state_len], emitted [batch, E, dim, state_len])``.
    """
    seqlen = xx.shape[-1] - state_len
    final = xx[..., seqlen:].clone()
    emitted = [xx[..., pos : pos + state_len] for pos in positions]
    if not emitted:
        return final, xx.new_zeros(xx.shape[0], 0, xx.shape[1], state_len)
    return final, torch.stack(emitted, dim=1)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """Decode step(s): convolve new tokens against ``conv_state`` and roll it.

    x: ``[batch, dim]`` (one token) or ``[batch, dim, seqlen]``;
    conv_state: ``[batch, dim, state_len]`` with ``state_len >= width - 1``
    (the last ``state_len`` inputs, oldest first). Mutates ``conv_state`` in
    place: it becomes the last ``state_len`` inputs after the new tokens.
    Returns the output with x's shape and dtype. Raises ValueError for
    inconsistent shapes.
    """
    single = x.dim() == 2
    xs = x.unsqueeze(-1) if single else x  # [batch, dim, seqlen]
    if xs.dim() != 3:
        raise ValueError(f"x must be [batch, dim] or [batch, dim, seqlen], got {tuple(x.shape)}")
    batch, dim, seqlen = xs.shape
    _check_weight(weight, bias, dim)
    _check_activation(activation)
    width = weight.shape[1]
    if conv_state.dim() != 3 or tuple(conv_state.shape[:2]) != (batch, dim):
        raise ValueError(
            f"conv_state must be [batch={batch}, dim={dim}, state_len], "
            f"got {tuple(conv_state.shape)}"
        )
    state_len = conv_state.shape[2]
    if state_len < width - 1:
        raise ValueError(f"conv_state holds {state_len} inputs, width {width} needs {width - 1}")
    xx = torch.cat([conv_state.float(), xs.float()], dim=-1)  # [batch, dim, state_len+L]
    out = _conv_window(xx[..., state_len - (width - 1) :], weight, bias)
    conv_state.copy_(xx[..., xx.shape[-1] - state_len :])
    out = _activate(out, activation).to(x.dtype)
    return out.squeeze(-1) if single else out
