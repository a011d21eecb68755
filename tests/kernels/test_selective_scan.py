"""Mamba-1 selective scan against a token-by-token recurrence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridkv.kernels import mamba_gpu
from hybridkv.kernels.conv1d import SpanOutput
from hybridkv.kernels.selective_scan import selective_scan_fn, selective_state_update

BATCH, DIM, DSTATE = 2, 8, 4


def reference_scan(u, delta, A, B, C, D, z, delta_bias, softplus, h0):
    """h[t] = exp(dt A) h[t-1] + dt B[t] u[t]; y[t] = C[t] h[t] + D u[t], gated by silu(z).

    B, C: [batch, groups, dstate, L]. Returns y [batch, dim, L] and the states
    after every token (states[k] is the state after k tokens).
    """
    dim, groups = u.shape[1], B.shape[1]
    group_of = torch.arange(dim) // (dim // groups)  # channel -> group
    h, states, ys = h0.clone(), [h0.clone()], []
    for t in range(u.shape[-1]):
        dt = delta[..., t] + (0 if delta_bias is None else delta_bias)
        dt = F.softplus(dt) if softplus else dt  # [batch, dim]
        Bt, Ct = B[:, group_of, :, t], C[:, group_of, :, t]  # [batch, dim, dstate]
        h = torch.exp(dt[..., None] * A) * h + (dt * u[..., t])[..., None] * Bt
        y = (h * Ct).sum(-1) + (0 if D is None else D * u[..., t])
        ys.append(y * F.silu(z[..., t]) if z is not None else y)
        states.append(h.clone())
    return torch.stack(ys, -1), states


def make_inputs(seqlen, groups=1, seed=0, slow=False):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(BATCH, DIM, seqlen, generator=g)
    delta = torch.randn(BATCH, DIM, seqlen, generator=g) * 0.5
    A = -torch.rand(DIM, DSTATE, generator=g) * (1e-4 if slow else 2.0) - (0 if slow else 0.1)
    B = torch.randn(BATCH, groups, DSTATE, seqlen, generator=g)
    C = torch.randn(BATCH, groups, DSTATE, seqlen, generator=g)
    D = torch.randn(DIM, generator=g)
    z = torch.randn(BATCH, DIM, seqlen, generator=g)
    delta_bias = torch.randn(DIM, generator=g) * 0.1
    h0 = torch.randn(BATCH, DIM, DSTATE, generator=g) * 3
    return u, delta, A, B, C, D, z, delta_bias, h0


@pytest.mark.parametrize("seqlen", [1, 7, 40, 300])
@pytest.mark.parametrize("groups", [1, 2])
def test_matches_reference_with_emitted_states(seqlen, groups):
    u, delta, A, B, C, D, z, delta_bias, h0 = make_inputs(seqlen, groups, seed=seqlen + groups)
    positions = sorted({0, 1, seqlen // 3, seqlen // 2, seqlen})
    Bk, Ck = (B[:, 0], C[:, 0]) if groups == 1 else (B, C)  # ungrouped layout [b, n, L]
    res = selective_scan_fn(u, delta, A, Bk, Ck, D, z, delta_bias, True,
                            initial_state=h0, emit_positions=positions)
    y_ref, states = reference_scan(u, delta, A, B, C, D, z, delta_bias, True, h0)
    assert isinstance(res, SpanOutput)
    torch.testing.assert_close(res.out, y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(res.final_state, states[seqlen], rtol=1e-4, atol=1e-4)
    assert res.emitted_states.shape == (BATCH, len(positions), DIM, DSTATE)
    for i, pos in enumerate(positions):
        torch.testing.assert_close(res.emitted_states[:, i], states[pos], rtol=1e-4, atol=1e-4)


def test_plain_options_and_return_conventions():
    u, delta, A, B, C, _, _, _, _ = make_inputs(12, seed=1)
    zeros = torch.zeros(BATCH, DIM, DSTATE)
    y_ref, states = reference_scan(u, delta.abs(), A, B, C, None, None, None, False, zeros)
    out = selective_scan_fn(u, delta.abs(), A, B[:, 0], C[:, 0])
    torch.testing.assert_close(out, y_ref, rtol=1e-4, atol=1e-4)
    out2, last = selective_scan_fn(u, delta.abs(), A, B[:, 0], C[:, 0], return_last_state=True)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(last, states[12], rtol=1e-4, atol=1e-4)
    res = selective_scan_fn(u, delta.abs(), A, B[:, 0], C[:, 0], emit_positions=[])
    assert res.emitted_states.shape == (BATCH, 0, DIM, DSTATE)


@pytest.mark.parametrize("split", [1, 5, 16, 39])
def test_split_span_resumes_from_emitted_state(split):
    u, delta, A, B, C, D, z, delta_bias, h0 = make_inputs(40, 2, seed=7)
    whole = selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, True, initial_state=h0,
                              emit_positions=[split])
    cut = (slice(None), slice(None), slice(None, split))
    rest = (slice(None), slice(None), slice(split, None))
    first = selective_scan_fn(u[cut], delta[cut], A, B[..., :split], C[..., :split], D, z[cut],
                              delta_bias, True, True, initial_state=h0)
    second = selective_scan_fn(u[rest], delta[rest], A, B[..., split:], C[..., split:], D,
                               z[rest], delta_bias, True, True,
                               initial_state=whole.emitted_states[:, 0])
    torch.testing.assert_close(first[1], whole.emitted_states[:, 0])
    torch.testing.assert_close(torch.cat([first[0], second[0]], -1), whole.out)
    torch.testing.assert_close(second[1], whole.final_state)


def test_slowly_decaying_state_survives_a_long_span():
    seqlen = 2100
    u, delta, A, B, C, D, z, delta_bias, h0 = make_inputs(seqlen, seed=11, slow=True)
    u = u * 0.01  # new inputs are small next to the carried state
    positions = [1000, 2048]
    res = selective_scan_fn(u, delta, A, B[:, 0], C[:, 0], D, z, delta_bias, True,
                            initial_state=h0, emit_positions=positions)
    y_ref, states = reference_scan(u, delta, A, B, C, D, z, delta_bias, True, h0)
    torch.testing.assert_close(res.out, y_ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(res.final_state, states[seqlen], rtol=1e-3, atol=1e-3)
    for i, pos in enumerate(positions):
        torch.testing.assert_close(res.emitted_states[:, i], states[pos], rtol=1e-3, atol=1e-3)
    dropped = selective_scan_fn(u, delta, A, B[:, 0], C[:, 0], D, z, delta_bias, True)
    gap = (dropped[..., -100:] - res.out[..., -100:]).abs().max()
    assert gap > 0.1, "a start state dropped at token 0 must still show at the end"


def test_decode_update_equals_span():
    u, delta, A, B, C, D, z, delta_bias, h0 = make_inputs(6, seed=4)
    res = selective_scan_fn(u, delta, A, B[:, 0], C[:, 0], D, z, delta_bias, True,
                            initial_state=h0, emit_positions=list(range(1, 7)))
    state = h0.clone()
    for t in range(6):
        out = selective_state_update(state, u[..., t], delta[..., t], A, B[:, 0, :, t],
                                     C[:, 0, :, t], D, z[..., t], delta_bias, True)
        assert out.shape == (BATCH, DIM)
        torch.testing.assert_close(out, res.out[..., t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state, res.emitted_states[:, t], rtol=1e-5, atol=1e-5)


def test_head_layout_update_matches_reference():
    g = torch.Generator().manual_seed(9)
    nheads, headdim, groups = 4, 3, 2
    state = torch.randn(BATCH, nheads, headdim, DSTATE, generator=g)
    x, dt, z = (torch.randn(BATCH, nheads, headdim, generator=g) for _ in range(3))
    A = -torch.rand(nheads, headdim, DSTATE, generator=g)
    B, C = (torch.randn(BATCH, groups, DSTATE, generator=g) for _ in range(2))
    D, dt_bias = torch.randn(nheads, headdim, generator=g), torch.randn(nheads, headdim)
    expected = state.clone()
    for h in range(nheads):
        grp = h // (nheads // groups)
        d = F.softplus(dt[:, h] + dt_bias[h])  # [batch, headdim]
        expected[:, h] = (torch.exp(d[..., None] * A[h]) * state[:, h]
                          + (d * x[:, h])[..., None] * B[:, grp, None, :])
    y_ref = torch.stack([expected[:, h] @ C[:, h // 2, :, None] for h in range(nheads)], 1)
    y_ref = (y_ref[..., 0] + D * x) * F.silu(z)
    out = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)
    torch.testing.assert_close(out, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, expected, rtol=1e-5, atol=1e-5)


def zero_start_kernel(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state):
    """Stands in for the CUDA ``selective_scan_fn``, which always starts from zero."""
    return selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                             return_last_state)


@pytest.mark.parametrize("groups", [1, 2])
def test_segmented_dispatch_adds_the_start_state(groups):
    u, delta, A, B, C, D, z, delta_bias, h0 = make_inputs(50, groups, seed=13)
    positions = [0, 16, 32, 50]
    got = mamba_gpu.selective_scan_segments(zero_start_kernel, u, delta, A, B, C, D, z,
                                            delta_bias, True, h0, positions)
    want = selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, True, initial_state=h0,
                             emit_positions=positions)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    cpu = mamba_gpu.selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, True,
                                      initial_state=h0, emit_positions=positions)
    torch.testing.assert_close(cpu.out, want.out)
    assert mamba_gpu.segments([16, 32], 40) == [(0, 16), (16, 32), (32, 40)]


@pytest.mark.parametrize(("positions", "match"), [([3, 2], "increasing"), ([41], "outside")])
def test_bad_emit_positions_raise(positions, match):
    u, delta, A, B, C, *_ = make_inputs(40)
    with pytest.raises(ValueError, match=match):
        selective_scan_fn(u, delta, A, B, C, emit_positions=positions)


def test_inconsistent_shapes_raise():
    u, delta, A, B, C, D, z, delta_bias, h0 = make_inputs(10, 2)
    cases = [
        ({"delta": delta[..., :9]}, "delta"),
        ({"A": A[:5]}, "A must be"),
        ({"B": B[..., :9]}, "B must be"),
        ({"C": torch.randn(BATCH, 3, DSTATE, 10)}, "groups of C"),
        ({"D": D[:3]}, "D must"),
        ({"initial_state": h0[..., :2]}, "initial_state"),
        ({"u": u[0]}, "u must be"),
    ]
    base = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D}
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            selective_scan_fn(**(base | change))
    state = h0.clone()
    with pytest.raises(ValueError, match="B and C"):
        selective_state_update(state, u[..., 0], delta[..., 0], A, B[..., 0], C[..., 0])
    with pytest.raises(ValueError, match="A must"):
        selective_state_update(state, u[..., 0], delta[..., 0], A[:3], B[:, 0, :, 0],
                               C[:, 0, :, 0])
