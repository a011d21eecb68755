"""Mamba-2 state space duality (SSD): chunked scan over a span, and decode.

Per head ``h`` the decay is a scalar, which is what makes a chunked form
possible. With ``dt = clamp(softplus(dt + dt_bias), *dt_limit)``:

    S[t] = exp(dt[t] * A[h]) * S[t-1] + dt[t] * x[t] (outer) B[t]   # [headdim, dstate]
    y[t] = S[t] @ C[t] + D[h] * x[t],   then y *= silu(z[t])

The span is cut into chunks of ``chunk_size`` tokens (the last one padded
with ``dt = 0``, which neither decays nor feeds the state). Inside a chunk
the output is a masked quadratic form, ``y = (C B^T * decay) (dt x)``; the
state at each chunk start is passed from chunk to chunk; each chunk's
output then adds the contribution of its start state. The gated RMSNorm of
the Mamba-2 mixer is not part of this kernel.

Arguments follow ``mamba_ssm``'s ``mamba_chunk_scan_combined`` so that a
CUDA build can take over (see ``mamba_gpu``); ``emit_positions`` adds the
states after chosen numbers of tokens, on or off chunk boundaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from hybridkv.kernels.conv1d import SpanOutput, check_emit_positions
from hybridkv.kernels.selective_scan import expect_shape, selective_state_update

NO_LIMIT = (0.0, math.inf)



def _check_D(D: torch.Tensor | None, nheads: int, headdim: int) -> None:
    if D is not None and tuple(D.shape) not in ((nheads,), (nheads, headdim)):
        raise ValueError(f"D must be [nheads] or [nheads, headdim] = {(nheads, headdim)}, "
                         f"got {tuple(D.shape)}")


def _check_scan_shapes(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states) -> None:
    if x.dim() != 4:
        raise ValueError(f"x must be [batch, L, nheads, headdim], got {tuple(x.shape)}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    batch, seqlen, nheads, headdim = x.shape
    if B.dim() != 4 or tuple(B.shape[:2]) != (batch, seqlen):
        raise ValueError(f"B must be [batch={batch}, L={seqlen}, ngroups, dstate], "
                         f"got {tuple(B.shape)}")
    if nheads % B.shape[2] != 0:
        raise ValueError(f"{nheads} heads are not a multiple of the {B.shape[2]} groups")
    dstate = B.shape[3]
    for name, t, shape in (("dt", dt, (batch, seqlen, nheads)), ("A", A, (nheads,)),
                           ("C", C, tuple(B.shape)), ("z", z, tuple(x.shape)),
                           ("dt_bias", dt_bias, (nheads,)),
                           ("initial_states", initial_states, (batch, nheads, headdim, dstate))):
        expect_shape(name, t, shape)
    _check_D(D, nheads, headdim)


def discretize_dt(dt, dt_bias=None, dt_softplus: bool = False, dt_limit=NO_LIMIT):
    """``clamp(softplus(dt + dt_bias), *dt_limit)`` in float32, each step optional.

    The clamp is skipped for the default ``(0, inf)``, as ``mamba_ssm`` does;
    ``dt_limit=None`` also means no clamp. dt: ``[..., nheads]``.
    """
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    if dt_limit is not None and tuple(dt_limit) != NO_LIMIT:
        dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
    return dt


def _chunked(t: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[batch, L, nheads, ...]`` -> ``[batch, nchunks, nheads, chunk_size, ...]``.

    Zero-padded at the end; an empty span still gets one (all padding) chunk.
    """
    pad = max(1, math.ceil(t.shape[1] / chunk_size)) * chunk_size - t.shape[1]
    if pad:
        t = torch.cat([t, t.new_zeros(t.shape[0], pad, *t.shape[2:])], dim=1)
    t = t.reshape(t.shape[0], -1, chunk_size, *t.shape[2:])
    return t.transpose(2, 3)


def _masked_decay(log_end: torch.Tensor, log_start: torch.Tensor, keep: torch.Tensor):
    """``exp(log_end - log_start)`` where ``keep``, else 0 (no overflow where masked)."""
    diff = (log_end - log_start).masked_fill(~keep, -math.inf)
    return torch.exp(diff)


def _intra_chunk(xdt, cum, B, C) -> torch.Tensor:
    """Output from tokens of the same chunk: the quadratic (attention-like) form.

    xdt: [b, c, h, Q, p] (x scaled by dt); cum: [b, c, h, Q]; B, C: [b, c, h, Q, n].
    Returns [b, c, h, Q, p].
    """
    Q = cum.shape[-1]
    causal = torch.ones(Q, Q, dtype=torch.bool, device=cum.device).tril()  # [l, s]
    decay = _masked_decay(cum[..., :, None], cum[..., None, :], causal)  # [b, c, h, l, s]
    return ((C @ B.transpose(-1, -2)) * decay) @ xdt


def _chunk_states(xdt, cum, B) -> torch.Tensor:
    """State each chunk builds from a zero start: [b, c, h, p, n]."""
    to_end = torch.exp(cum[..., -1:] - cum)  # [b, c, h, Q]
    return (xdt * to_end[..., None]).transpose(-1, -2) @ B


def _pass_states(h0, chunk_states, chunk_decay) -> torch.Tensor:
    """Start state of every chunk plus the final one: [b, c + 1, h, p, n].

    h0: [b, h, p, n]; chunk_states: [b, c, h, p, n]; chunk_decay: [b, c, h].
    """
    starts = [h0]
    for c in range(chunk_states.shape[1]):
        starts.append(chunk_decay[:, c, :, None, None] * starts[-1] + chunk_states[:, c])
    return torch.stack(starts, dim=1)


def _emitted_states(positions, xdt, cum, B, starts) -> torch.Tensor:
    """States after each emit position, on or off chunk boundaries: [b, E, h, p, n].

    Position k lies in chunk c = (k - 1) // Q at offset r = k - c * Q (r = 0 only
    for k = 0): state = exp(cum[c, r-1]) * starts[c] + the first r tokens of c.
    """
    Q = cum.shape[-1]
    pos = torch.tensor(positions, dtype=torch.long, device=cum.device)
    chunk = (pos - 1).clamp(min=0) // Q  # [E]
    offset = pos - chunk * Q  # [E], in 0..Q
    cum0 = F.pad(cum, (1, 0))  # [b, c, h, Q + 1], cum0[..., r] = log decay of r tokens
    total = cum0.transpose(2, 3)[:, chunk, offset]  # [b, E, h]
    keep = torch.arange(Q, device=cum.device)[None, :] < offset[:, None]  # [E, Q]
    weight = _masked_decay(total[..., None], cum[:, chunk], keep[None, :, None, :])
    fed = (xdt[:, chunk] * weight[..., None]).transpose(-1, -2) @ B[:, chunk]
    return torch.exp(total)[..., None, None] * starts[:, chunk] + fed


def _ssd_scan(x, dt, A, B, C, chunk_size, h0, positions):
    """Chunked scan in float32; returns ``(y, final_state, emitted)``.

    x: [b, L, h, p]; dt: [b, L, h]; A: [h]; B, C: [b, L, h, n]; h0: [b, h, p, n].
    Inside, chunks are head-major: [b, c, h, Q, ...].
    """
    batch, seqlen, nheads, headdim = x.shape
    xdt = _chunked(x * dt[..., None], chunk_size)  # [b, c, h, Q, p]
    Bc, Cc = _chunked(B, chunk_size), _chunked(C, chunk_size)  # [b, c, h, Q, n]
    cum = torch.cumsum(_chunked(dt * A, chunk_size), dim=-1)  # [b, c, h, Q], log decay
    starts = _pass_states(h0, _chunk_states(xdt, cum, Bc), torch.exp(cum[..., -1]))
    from_start = (Cc @ starts[:, :-1].transpose(-1, -2)) * torch.exp(cum)[..., None]
    y = _intra_chunk(xdt, cum, Bc, Cc) + from_start  # [b, c, h, Q, p]
    y = y.transpose(2, 3).reshape(batch, -1, nheads, headdim)[:, :seqlen]
    emitted = _emitted_states(positions, xdt, cum, Bc, starts) if positions else None
    return y, starts[:, -1], emitted


def _heads(M: torch.Tensor, nheads: int) -> torch.Tensor:
    """Groups to heads: ``[..., ngroups, n]`` -> ``[..., nheads, n]`` float32."""
    return M.float().repeat_interleave(nheads // M.shape[-2], dim=-2)


def _finish(y, x, D, z) -> torch.Tensor:
    """Add the D skip and the z gate to y ``[b, L, h, p]``; cast to x's dtype."""
    if D is not None:
        Dp = D.float() if D.dim() == 2 else D.float()[:, None]  # [h, p] or [h, 1]
        y = y + Dp * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = NO_LIMIT,
    return_final_states: bool = False,
    return_varlen_states: bool = False,
    *,
    emit_positions: Sequence[int] | None = None,
):
    """Mamba-2 chunked scan over a span, starting from ``initial_states``.

    x, z: ``[batch, L, nheads, headdim]``; dt: ``[batch, L, nheads]``; A,
    dt_bias: ``[nheads]``; B, C: ``[batch, L, ngroups, dstate]``; D:
    ``[nheads]`` or ``[nheads, headdim]``; initial_states: ``[batch, nheads,
    headdim, dstate]`` (zeros when ``None``). Packed sequences (``seq_idx``,
    ``cu_seqlens``, ``return_varlen_states``) are not supported.
    Returns ``out`` (x's shape and dtype), or ``(out, final_states)`` when
    ``return_final_states``, as ``mamba_ssm`` does. With ``emit_positions``
    it returns ``SpanOutput(out, final_states, emitted_states)``, emitted
    states ``[batch, E, nheads, headdim, dstate]`` float32.
    Raises ValueError for inconsistent shapes or emit positions.
    """
    if seq_idx is not None or cu_seqlens is not None or return_varlen_states:
        raise ValueError("packed sequences (seq_idx, cu_seqlens) are not supported; "
                         "run one call per sequence")
    _check_scan_shapes(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states)
    batch, seqlen, nheads, headdim = x.shape
    positions = check_emit_positions(emit_positions, seqlen)
    dstate = B.shape[3]
    h0 = x.new_zeros(batch, nheads, headdim, dstate, dtype=torch.float32)
    if initial_states is not None:
        h0 = initial_states.float()
    dt = discretize_dt(dt, dt_bias, dt_softplus, dt_limit)  # [b, L, h]
    y, final, emitted = _ssd_scan(x.float(), dt, A.float(), _heads(B, nheads),
                                  _heads(C, nheads), chunk_size, h0, positions)
    out = _finish(y, x, D, z)
    if emit_positions is not None:
        if emitted is None:
            emitted = h0.new_zeros(batch, 0, nheads, headdim, dstate)
        return SpanOutput(out, final, emitted)
    return (out, final) if return_final_states else out


def ssd_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] | None = None,
) -> torch.Tensor:
    """One Mamba-2 decode token in the per-head layout; updates ``state`` in place.

    state: ``[batch, nheads, headdim, dstate]``; x, z: ``[batch, nheads,
    headdim]``; dt: ``[batch, nheads]``; A, dt_bias: ``[nheads]``; B, C:
    ``[batch, ngroups, dstate]``; D: ``[nheads]`` or ``[nheads, headdim]``.
    ``dt_limit`` defaults to no clamp, as the decode steps of ``mamba_ssm``
    and ``transformers`` do; pass the scan's limit to clamp here too.
    Returns the output ``[batch, nheads, headdim]`` in x's dtype. Raises
    ValueError for inconsistent shapes.
    """
    dt, A, D = per_channel_decode_args(state, x, dt, A, D, dt_bias, dt_softplus, dt_limit)
    return selective_state_update(state, x, dt, A, B, C, D, z)


def per_channel_decode_args(state, x, dt, A, D, dt_bias, dt_softplus, dt_limit):
    """Per-head decode arguments spread over headdim, as ``selective_state_update`` takes them.

    Returns ``(dt [batch, nheads, headdim] discretised, A [nheads, headdim,
    dstate], D [nheads, headdim] or None)``. Raises ValueError for
    inconsistent shapes.
    """
    if state.dim() != 4:
        raise ValueError(f"state must be [batch, nheads, headdim, dstate], got "
                         f"{tuple(state.shape)}")
    batch, nheads, headdim, dstate = state.shape
    for name, t, shape in (("x", x, (batch, nheads, headdim)), ("dt", dt, (batch, nheads)),
                           ("A", A, (nheads,)), ("dt_bias", dt_bias, (nheads,))):
        expect_shape(name, t, shape)
    _check_D(D, nheads, headdim)
    dt = discretize_dt(dt, dt_bias, dt_softplus, dt_limit)[..., None].expand(-1, -1, headdim)
    A = A.float()[:, None, None].expand(nheads, headdim, dstate)
    if D is not None and D.dim() == 1:
        D = D[:, None].expand(nheads, headdim)
    return dt, A, D
