"""Mamba-1 selective scan over a span, and its one-token decode update.

The recurrence, per channel ``d`` and state index ``n``, with
``dt = softplus(delta + delta_bias)`` (softplus optional):

    h[t] = exp(dt[t] * A[d, n]) * h[t-1] + dt[t] * B[t, n] * u[t]
    y[t] = sum_n C[t, n] * h[t, n] + D[d] * u[t],   then y *= silu(z[t])

Arguments follow ``mamba_ssm``'s ``selective_scan_fn`` and
``selective_state_update`` so that a CUDA build can take over (see
``mamba_gpu``). Added for prefix caching: the scan starts from
``initial_state`` (``[batch, dim, dstate]``; zeros when ``None``) and
``emit_positions`` returns copies of the state after chosen numbers of
tokens. Everything is computed in float32; states are returned in float32.

The time loop is unavoidable for Mamba-1 (the decay differs per channel and
state index), so it is kept to one fused multiply-add per token: the
discretised terms are computed for a slab of ``TIME_SLAB`` tokens at once
and the outputs are contracted with ``C`` per slab.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from hybridkv.kernels.conv1d import SpanOutput, check_emit_positions

TIME_SLAB = 256


def expect_shape(name: str, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if tensor is not None and tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")


def _grouped(name: str, M: torch.Tensor, batch: int, dim: int, dstate: int, seqlen: int):
    """B or C as ``[batch, groups, seqlen, dstate]`` float32."""
    if M.dim() == 3:
        M = M.unsqueeze(1)  # [batch, 1, dstate, seqlen]
    if M.dim() != 4 or M.shape[0] != batch or tuple(M.shape[2:]) != (dstate, seqlen):
        raise ValueError(
            f"{name} must be [batch, dstate, L] or [batch, groups, dstate, L] with "
            f"batch={batch}, dstate={dstate}, L={seqlen}; got {tuple(M.shape)}"
        )
    if dim % M.shape[1] != 0:
        raise ValueError(f"dim {dim} is not a multiple of the {M.shape[1]} groups of {name}")
    return M.float().transpose(2, 3)  # [batch, groups, seqlen, dstate]


def _discretize_dt(delta, delta_bias, delta_softplus: bool) -> torch.Tensor:
    dt = delta.float()
    if delta_bias is not None:
        dt = dt + delta_bias.float()[..., None]
    return F.softplus(dt) if delta_softplus else dt


def _per_channel(M: torch.Tensor, dim: int) -> torch.Tensor:
    """``[batch, groups, T, dstate]`` -> ``[batch, dim, T, dstate]`` (a view when possible)."""
    batch, groups, steps, dstate = M.shape
    M = M.unsqueeze(2).expand(batch, groups, dim // groups, steps, dstate)
    return M.reshape(batch, dim, steps, dstate)


def _scan_slab(h, dt, u, A, B, C):
    """Run the recurrence over one slab of tokens; returns ``(y, states)``.

    h: [batch, dim, dstate]; dt, u: [batch, dim, T]; A: [dim, dstate];
    B, C: [batch, dim, T, dstate]. states: [batch, dim, T, dstate].
    """
    dA = torch.exp(dt[..., None] * A[:, None, :])  # [batch, dim, T, dstate]
    dBu = (dt * u)[..., None] * B  # [batch, dim, T, dstate]
    states = torch.empty_like(dBu)
    for t in range(dBu.shape[2]):
        h = torch.addcmul(dBu[:, :, t], dA[:, :, t], h)
        states[:, :, t] = h
    y = (states * C).sum(-1)  # [batch, dim, T]
    return y, states


def _run_scan(u, dt, A, B, C, h, positions):
    """Whole-span scan; returns ``(y, final_state, emitted)`` in float32."""
    dim, seqlen = u.shape[1], u.shape[2]
    emitted = {0: h.clone()} if positions and positions[0] == 0 else {}
    wanted = set(positions)
    ys = []
    for t0 in range(0, seqlen, TIME_SLAB):
        t1 = min(t0 + TIME_SLAB, seqlen)
        Bs, Cs = _per_channel(B[:, :, t0:t1], dim), _per_channel(C[:, :, t0:t1], dim)
        y, states = _scan_slab(h, dt[..., t0:t1], u[..., t0:t1], A, Bs, Cs)
        ys.append(y)
        h = states[:, :, -1]
        for pos in wanted.intersection(range(t0 + 1, t1 + 1)):
            emitted[pos] = states[:, :, pos - 1 - t0].clone()
    y = torch.cat(ys, dim=-1) if ys else u.new_zeros(u.shape)
    return y, h.clone(), [emitted[pos] for pos in positions]


def selective_scan_fn(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    *,
    initial_state: torch.Tensor | None = None,
    emit_positions: Sequence[int] | None = None,
):
    """Mamba-1 selective scan over a span, starting from ``initial_state``.

    u, delta, z: ``[batch, dim, L]``; A: ``[dim, dstate]``; B, C:
    ``[batch, dstate, L]`` or grouped ``[batch, groups, dstate, L]``; D,
    delta_bias: ``[dim]``; initial_state: ``[batch, dim, dstate]``.
    Returns ``out`` ``[batch, dim, L]`` in u's dtype, or ``(out,
    last_state)`` when ``return_last_state``, as ``mamba_ssm`` does. With
    ``emit_positions`` (e.g. ``[16, 32]`` for a 40-token span) it returns
    ``SpanOutput(out, last_state, emitted_states)`` with emitted states
    ``[batch, E, dim, dstate]``. Raises ValueError for inconsistent shapes
    or emit positions.
    """
    if u.dim() != 3:
        raise ValueError(f"u must be [batch, dim, L], got {tuple(u.shape)}")
    batch, dim, seqlen = u.shape
    if A.dim() != 2 or A.shape[0] != dim:
        raise ValueError(f"A must be [dim={dim}, dstate], got {tuple(A.shape)}")
    dstate = A.shape[1]
    for name, t, shape in (("delta", delta, u.shape), ("z", z, u.shape), ("D", D, (dim,)),
                           ("delta_bias", delta_bias, (dim,)),
                           ("initial_state", initial_state, (batch, dim, dstate))):
        expect_shape(name, t, tuple(shape))
    positions = check_emit_positions(emit_positions, seqlen)
    Bg = _grouped("B", B, batch, dim, dstate, seqlen)
    Cg = _grouped("C", C, batch, dim, dstate, seqlen)
    h = u.new_zeros(batch, dim, dstate, dtype=torch.float32)
    if initial_state is not None:
        h = initial_state.float()
    dt = _discretize_dt(delta, delta_bias, delta_softplus)  # [batch, dim, L]
    y, final, emitted = _run_scan(u.float(), dt, A.float(), Bg, Cg, h, positions)
    if D is not None:
        y = y + D.float()[:, None] * u.float()
    if z is not None:
        y = y * F.silu(z.float())
    out = y.to(u.dtype)
    if emit_positions is not None:
        stacked = torch.stack(emitted, 1) if emitted else h.new_zeros(batch, 0, dim, dstate)
        return SpanOutput(out, final, stacked)
    return (out, final) if return_last_state else out


def _as_heads(state, x, dt, A, B, C, D, z, dt_bias):
    """Give the Mamba-1 layout a heads dim of 1 so both layouts share one path."""
    def add(t, dim_index):
        return None if t is None else t.unsqueeze(dim_index)

    return (state.unsqueeze(1), x.unsqueeze(1), dt.unsqueeze(1), A.unsqueeze(0),
            B.unsqueeze(1), C.unsqueeze(1), add(D, 0), add(z, 1), add(dt_bias, 0))


def _check_update_shapes(state, x, dt, A, B, C, D, z, dt_bias) -> None:
    if state.dim() != 4:
        raise ValueError(f"state must be [batch, dim, dstate] or [batch, nheads, headdim, "
                         f"dstate], got {tuple(state.shape)}")
    batch, nheads, headdim, dstate = state.shape
    for name, t, shape in (("x", x, (batch, nheads, headdim)), ("dt", dt, (batch, nheads, headdim)),
                           ("A", A, (nheads, headdim, dstate)), ("D", D, (nheads, headdim)),
                           ("z", z, (batch, nheads, headdim)),
                           ("dt_bias", dt_bias, (nheads, headdim))):
        expect_shape(name, t, shape)
    for name, M in (("B", B), ("C", C)):
        if M.dim() != 3 or M.shape[0] != batch or M.shape[2] != dstate:
            raise ValueError(f"{name} must be [batch={batch}, groups, dstate={dstate}], "
                             f"got {tuple(M.shape)}")
        if nheads % M.shape[1] != 0:
            raise ValueError(f"{nheads} heads are not a multiple of the {M.shape[1]} groups")


def selective_state_update(
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
) -> torch.Tensor:
    """One decode token of the selective scan; updates ``state`` in place.

    Mamba-1 layout: state ``[batch, dim, dstate]``, x/dt/z ``[batch, dim]``,
    A ``[dim, dstate]``, B/C ``[batch, dstate]``, D/dt_bias ``[dim]``.
    Head layout (Mamba-2, as ``mamba_ssm`` takes it): state ``[batch,
    nheads, headdim, dstate]``, x/dt/z ``[batch, nheads, headdim]``, A
    ``[nheads, headdim, dstate]``, B/C ``[batch, ngroups, dstate]``,
    D/dt_bias ``[nheads, headdim]``. Returns the output, x's shape and dtype.
    Raises ValueError for inconsistent shapes.
    """
    mamba1 = state.dim() == 3
    if mamba1:
        if B.dim() != 2 or C.dim() != 2:
            raise ValueError("B and C must be [batch, dstate] with a [batch, dim, dstate] state")
        args = _as_heads(state, x, dt, A, B, C, D, z, dt_bias)
    else:
        args = (state, x, dt, A, B, C, D, z, dt_bias)
    _check_update_shapes(*args)
    out = _update_heads(*args, dt_softplus)
    return out.squeeze(1) if mamba1 else out


def _update_heads(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus: bool) -> torch.Tensor:
    """Head-layout update; ``state`` [batch, nheads, headdim, dstate] is written in place."""
    nheads = state.shape[1]
    dt = dt.float() + (0.0 if dt_bias is None else dt_bias.float())
    dt = F.softplus(dt) if dt_softplus else dt  # [batch, nheads, headdim]
    Bh = B.float().repeat_interleave(nheads // B.shape[1], dim=1)  # [batch, nheads, dstate]
    Ch = C.float().repeat_interleave(nheads // C.shape[1], dim=1)
    dA = torch.exp(dt[..., None] * A.float())  # [batch, nheads, headdim, dstate]
    new = dA * state.float() + (dt * x.float())[..., None] * Bh[:, :, None, :]
    state.copy_(new)
    y = torch.einsum("bhpn,bhn->bhp", new, Ch)
    if D is not None:
        y = y + D.float() * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)
