"""Dispatch of the Mamba kernels to ``causal_conv1d`` / ``mamba_ssm`` on CUDA.

Each function here has the contract of its torch counterpart in
``conv1d``, ``selective_scan`` and ``ssd`` (same arguments, same returns)
and runs the CUDA package when the tensors are on CUDA and the package
imports; otherwise it is the torch path. The packages are imported only
inside these functions, and only for CUDA tensors.

What the packages lack is bridged here:

- emitted states: the span is cut at ``emit_positions`` and run segment by
  segment, each starting from the previous segment's final state;
- a Mamba-1 initial state (``selective_scan_fn`` always starts from zero):
  the scan is linear in its state, so the start state's share,
  ``C[t] . exp(sum_{s<=t} dt[s] A) h0``, is added to the zero-start output.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from hybridkv.kernels import conv1d, selective_scan, ssd
from hybridkv.kernels.conv1d import SpanOutput, check_emit_positions


@functools.cache
def _load(module: str, name: str) -> Callable | None:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _cuda_op(tensor: torch.Tensor, module: str, name: str) -> Callable | None:
    return _load(module, name) if tensor.is_cuda else None


def segments(positions: Sequence[int], seqlen: int) -> list[tuple[int, int]]:
    """Cut ``[0, seqlen)`` at the emit positions: ``[16, 32], 40 -> [(0,16), (16,32), (32,40)]``."""
    cuts = sorted({0, seqlen, *positions})
    return list(zip(cuts[:-1], cuts[1:]))


def _stack(states: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Emitted states on dim 1: ``[batch, E, ...]``, also for ``E = 0``."""
    if not states:
        return like.new_zeros(like.shape[0], 0, *like.shape[1:])
    return torch.stack(states, dim=1)


def _package_return(out, final, emitted, emit_positions, return_final: bool):
    """The torch path's return convention: out, (out, final) or ``SpanOutput``."""
    if emit_positions is None:
        return (out, final) if return_final else out
    return SpanOutput(out, final, emitted)


def _channel_last(t: torch.Tensor) -> torch.Tensor:
    """Same values and shape ``[batch, dim, L]``, stored with ``dim`` innermost."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None,
                     *, emit_positions=None):
    """``conv1d.causal_conv1d_fn`` through ``causal_conv1d`` on CUDA.

    The conv states are slices of the input, so they are read off in torch.
    """
    kernel = _cuda_op(x, "causal_conv1d", "causal_conv1d_fn")
    if kernel is None or seq_idx is not None:
        return conv1d.causal_conv1d_fn(x, weight, bias, seq_idx, initial_states,
                                       return_final_states, final_states_out, activation,
                                       emit_positions=emit_positions)
    positions = check_emit_positions(emit_positions, x.shape[-1])
    state_len = weight.shape[1] - 1
    start = x.new_zeros(x.shape[0], x.shape[1], state_len)
    if initial_states is not None:  # the package takes a start state in channel-last layout
        x, start = _channel_last(x), _channel_last(initial_states.to(x.dtype))
    final, emitted = conv1d.conv_states(torch.cat([start, x], dim=-1), state_len, positions)
    out = kernel(x, weight, bias, None, start if initial_states is not None else None,
                 False, None, activation)
    if final_states_out is not None:
        final_states_out.copy_(final)
    return _package_return(out, final, emitted, emit_positions, return_final_states)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None):
    """``conv1d.causal_conv1d_update`` through ``causal_conv1d`` on CUDA."""
    kernel = _cuda_op(x, "causal_conv1d", "causal_conv1d_update") or conv1d.causal_conv1d_update
    return kernel(x, conv_state, weight, bias, activation)


def _start_state_share(delta, A, C, delta_bias, delta_softplus, h0):
    """Output and end-state terms a start state ``h0`` adds to a zero-start scan.

    delta: [b, d, T]; A: [d, n]; C: [b, n, T] or [b, g, n, T]; h0: [b, d, n].
    Returns ``(y [b, d, T], end_state [b, d, n])`` in float32.
    """
    dt = delta.float() + (0.0 if delta_bias is None else delta_bias.float()[:, None])
    dt = F.softplus(dt) if delta_softplus else dt
    carried = torch.exp(torch.cumsum(dt[..., None] * A.float()[:, None, :], dim=2))
    carried = carried * h0.float()[:, :, None, :]  # [b, d, T, n]
    Cg = C.float() if C.dim() == 4 else C.float()[:, None]  # [b, g, n, T]
    b, d, T, n = carried.shape
    y = torch.einsum("bgctn,bgnt->bgct", carried.view(b, Cg.shape[1], -1, T, n), Cg)
    return y.reshape(b, d, T), carried[:, :, -1]


def selective_scan_segments(kernel, u, delta, A, B, C, D=None, z=None, delta_bias=None,
                            delta_softplus=False, initial_state=None, positions=()):
    """Scan with a zero-start ``kernel`` (``selective_scan_fn``'s contract), cut at ``positions``.

    Returns ``(out, final_state, emitted)`` like the torch path: out in u's
    dtype, states float32, emitted ``[b, E, d, n]``.
    """
    state, at = initial_state, {}
    outs = []
    for t0, t1 in segments(positions, u.shape[-1]):
        d_part, C_part = delta[..., t0:t1], C[..., t0:t1]
        y, end = kernel(u[..., t0:t1], d_part, A, B[..., t0:t1], C_part, D, None, delta_bias,
                        delta_softplus, True)
        y, end = y.float(), end.float()
        if state is not None:
            y_h, end_h = _start_state_share(d_part, A, C_part, delta_bias, delta_softplus, state)
            y, end = y + y_h, end + end_h
        outs.append(y)
        state = at[t1] = end
    zero = u.new_zeros(u.shape[0], A.shape[0], A.shape[1], dtype=torch.float32)
    at[0] = zero if initial_state is None else initial_state.float()
    out = torch.cat(outs, dim=-1) if outs else u.float()[..., :0]
    if z is not None:
        out = out * F.silu(z.float())
    final = at[u.shape[-1]]
    return out.to(u.dtype), final, _stack([at[p] for p in positions], final)


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, *, initial_state=None, emit_positions=None):
    """``selective_scan.selective_scan_fn`` through ``mamba_ssm`` on CUDA."""
    kernel = _cuda_op(u, "mamba_ssm.ops.selective_scan_interface", "selective_scan_fn")
    args = (u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    if kernel is None:
        return selective_scan.selective_scan_fn(*args, return_last_state,
                                                initial_state=initial_state,
                                                emit_positions=emit_positions)
    positions = check_emit_positions(emit_positions, u.shape[-1])
    out, final, emitted = selective_scan_segments(kernel, *args, initial_state, positions)
    return _package_return(out, final, emitted, emit_positions, return_last_state)


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False):
    """``selective_scan.selective_state_update`` through ``mamba_ssm`` on CUDA."""
    kernel = _cuda_op(x, "mamba_ssm.ops.triton.selective_state_update", "selective_state_update")
    kernel = kernel or selective_scan.selective_state_update
    return kernel(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)


def ssd_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                     dt_limit=None):
    """``ssd.ssd_state_update`` through ``mamba_ssm``'s ``selective_state_update`` on CUDA."""
    dt, A, D = ssd.per_channel_decode_args(state, x, dt, A, D, dt_bias, dt_softplus, dt_limit)
    return selective_state_update(state, x, dt, A, B, C, D, z)


def chunk_scan_segments(kernel, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                        initial_states=None, dt_softplus=False, dt_limit=ssd.NO_LIMIT,
                        positions=()):
    """SSD scan with ``kernel`` (``mamba_chunk_scan_combined``'s contract), cut at ``positions``.

    Returns ``(out, final_states, emitted)``, emitted ``[b, E, h, p, n]``.
    """
    zero = x.new_zeros(x.shape[0], x.shape[2], x.shape[3], B.shape[3], dtype=torch.float32)
    state = zero if initial_states is None else initial_states.float()
    at, outs = {0: state}, []
    for t0, t1 in segments(positions, x.shape[1]):
        cut = (slice(None), slice(t0, t1))
        zs = None if z is None else z[cut]
        y, state = kernel(x[cut], dt[cut], A, B[cut], C[cut], chunk_size, D, zs, dt_bias, state,
                          dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=True)
        outs.append(y)
        at[t1] = state = state.float()
    out = torch.cat(outs, dim=1) if outs else x[:, :0]
    final = at[x.shape[1]]
    return out, final, _stack([at[p] for p in positions], final)


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=ssd.NO_LIMIT, return_final_states=False,
                              return_varlen_states=False, *, emit_positions=None):
    """``ssd.mamba_chunk_scan_combined`` through ``mamba_ssm`` on CUDA."""
    kernel = _cuda_op(x, "mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined")
    packed = seq_idx is not None or cu_seqlens is not None or return_varlen_states
    if kernel is None or packed:
        return ssd.mamba_chunk_scan_combined(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, dt_limit, return_final_states, return_varlen_states,
            emit_positions=emit_positions)
    positions = check_emit_positions(emit_positions, x.shape[1])
    out, final, emitted = chunk_scan_segments(kernel, x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                              initial_states, dt_softplus, dt_limit, positions)
    return _package_return(out, final, emitted, emit_positions, return_final_states)
