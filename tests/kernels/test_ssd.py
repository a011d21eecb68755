"""Mamba-2 chunked scan against a token-by-token recurrence and transformers' torch path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridkv.kernels import mamba_gpu
from hybridkv.kernels.conv1d import SpanOutput
from hybridkv.kernels.ssd import discretize_dt, mamba_chunk_scan_combined, ssd_state_update

BATCH, NHEADS, HEADDIM, DSTATE = 2, 4, 3, 5


def reference_ssd(x, dt, A, B, C, D, z, h0):
    """S[t] = exp(dt A) S[t-1] + dt x[t] B[t]^T; y[t] = S[t] C[t] + D x[t], gated by silu(z).

    dt is already discretised. Returns y [batch, L, h, p] and the states after
    every token (states[k] is the state after k tokens).
    """
    head_group = torch.arange(NHEADS) // (NHEADS // B.shape[2])
    Dp = None if D is None else (D if D.dim() == 2 else D[:, None])
    S, states, ys = h0.clone(), [h0.clone()], []
    for t in range(x.shape[1]):
        Bt, Ct = B[:, t, head_group], C[:, t, head_group]  # [batch, h, n]
        decay = torch.exp(dt[:, t] * A)[..., None, None]  # [batch, h, 1, 1]
        S = decay * S + (dt[:, t, :, None] * x[:, t])[..., None] * Bt[:, :, None, :]
        y = (S * Ct[:, :, None, :]).sum(-1)
        y = y + (0 if Dp is None else Dp * x[:, t])
        ys.append(y * F.silu(z[:, t]) if z is not None else y)
        states.append(S.clone())
    return torch.stack(ys, 1), states


def make_inputs(seqlen, groups=1, seed=0, slow=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, seqlen, NHEADS, HEADDIM, generator=g)
    dt = torch.randn(BATCH, seqlen, NHEADS, generator=g)
    A = -torch.rand(NHEADS, generator=g) * (1e-3 if slow else 2.0)
    B = torch.randn(BATCH, seqlen, groups, DSTATE, generator=g)
    C = torch.randn(BATCH, seqlen, groups, DSTATE, generator=g)
    D = torch.randn(NHEADS, generator=g)
    z = torch.randn(BATCH, seqlen, NHEADS, HEADDIM, generator=g)
    dt_bias = torch.randn(NHEADS, generator=g) * 0.5
    h0 = torch.randn(BATCH, NHEADS, HEADDIM, DSTATE, generator=g) * 3
    return x, dt, A, B, C, D, z, dt_bias, h0


CASES = [  # (seqlen, chunk_size): chunks that divide L, that don't, one chunk, a tiny span
    (1, 4), (7, 4), (16, 4), (33, 8), (64, 16), (50, 64), (45, 1),
]


@pytest.mark.parametrize(("seqlen", "chunk_size"), CASES)
@pytest.mark.parametrize("groups", [1, 2])
def test_matches_reference_with_emitted_states(seqlen, chunk_size, groups):
    x, dt, A, B, C, D, z, dt_bias, h0 = make_inputs(seqlen, groups, seed=seqlen * 3 + groups)
    positions = sorted({0, 1, chunk_size, seqlen // 2, seqlen - 1, seqlen} & set(
        range(seqlen + 1)))
    res = mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D, z, dt_bias, h0,
                                    dt_softplus=True, emit_positions=positions)
    dt_ref = F.softplus(dt + dt_bias)
    y_ref, states = reference_ssd(x, dt_ref, A, B, C, D, z, h0)
    assert isinstance(res, SpanOutput)
    torch.testing.assert_close(res.out, y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(res.final_state, states[seqlen], rtol=1e-4, atol=1e-4)
    assert res.emitted_states.shape == (BATCH, len(positions), NHEADS, HEADDIM, DSTATE)
    for i, pos in enumerate(positions):
        torch.testing.assert_close(res.emitted_states[:, i], states[pos], rtol=1e-4, atol=1e-4)


def test_emit_positions_on_and_off_chunk_boundaries():
    x, dt, A, B, C, D, _, dt_bias, h0 = make_inputs(40, seed=2)
    positions = [3, 8, 15, 16, 17, 24, 31, 39, 40]  # chunk 8: boundaries 8, 16, 24, 40
    res = mamba_chunk_scan_combined(x, dt, A, B, C, 8, D, None, dt_bias, h0,
                                    dt_softplus=True, emit_positions=positions)
    _, states = reference_ssd(x, F.softplus(dt + dt_bias), A, B, C, D, None, h0)
    for i, pos in enumerate(positions):
        torch.testing.assert_close(res.emitted_states[:, i], states[pos], rtol=1e-4, atol=1e-4)


def test_output_does_not_depend_on_chunk_size():
    x, dt, A, B, C, D, z, dt_bias, h0 = make_inputs(70, 2, seed=3)
    runs = [mamba_chunk_scan_combined(x, dt, A, B, C, q, D, z, dt_bias, h0, dt_softplus=True,
                                      return_final_states=True) for q in (1, 7, 32, 128)]
    for out, final in runs[1:]:
        torch.testing.assert_close(out, runs[0][0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(final, runs[0][1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", [1, 8, 13, 31])
def test_split_span_resumes_from_emitted_state(split):
    x, dt, A, B, C, D, z, dt_bias, h0 = make_inputs(32, 2, seed=5)
    whole = mamba_chunk_scan_combined(x, dt, A, B, C, 8, D, z, dt_bias, h0, dt_softplus=True,
                                      emit_positions=[split])
    first = mamba_chunk_scan_combined(
        x[:, :split], dt[:, :split], A, B[:, :split], C[:, :split], 8, D, z[:, :split],
        dt_bias, h0, dt_softplus=True, return_final_states=True)
    second = mamba_chunk_scan_combined(
        x[:, split:], dt[:, split:], A, B[:, split:], C[:, split:], 8, D, z[:, split:],
        dt_bias, whole.emitted_states[:, 0], dt_softplus=True, return_final_states=True)
    torch.testing.assert_close(first[1], whole.emitted_states[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([first[0], second[0]], 1), whole.out,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second[1], whole.final_state, rtol=1e-5, atol=1e-5)


def test_slowly_decaying_state_survives_a_long_span():
    seqlen = 2100
    x, dt, A, B, C, D, z, dt_bias, h0 = make_inputs(seqlen, seed=11, slow=True)
    x = x * 0.01  # new inputs are small next to the carried state
    positions = [1000, 2048, 2099]
    res = mamba_chunk_scan_combined(x, dt, A, B, C, 64, D, z, dt_bias, h0, dt_softplus=True,
                                    emit_positions=positions)
    y_ref, states = reference_ssd(x, F.softplus(dt + dt_bias), A, B, C, D, z, h0)
    torch.testing.assert_close(res.out, y_ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(res.final_state, states[seqlen], rtol=1e-3, atol=1e-3)
    for i, pos in enumerate(positions):
        torch.testing.assert_close(res.emitted_states[:, i], states[pos], rtol=1e-3, atol=1e-3)
    dropped = mamba_chunk_scan_combined(x, dt, A, B, C, 64, D, z, dt_bias, None,
                                        dt_softplus=True)
    gap = (dropped[:, -100:] - res.out[:, -100:]).abs().max()
    assert gap > 0.1, "a start state dropped at token 0 must still show at the end"


def test_dt_limit_clamps_after_softplus():
    x, dt, A, B, C, _, _, dt_bias, h0 = make_inputs(20, seed=6)
    limit = (0.3, 0.9)
    out, final = mamba_chunk_scan_combined(x, dt, A, B, C, 8, None, None, dt_bias, h0,
                                           dt_softplus=True, dt_limit=limit,
                                           return_final_states=True)
    dt_ref = F.softplus(dt + dt_bias).clamp(*limit)
    y_ref, states = reference_ssd(x, dt_ref, A, B, C, None, None, h0)
    torch.testing.assert_close(out, y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, states[20], rtol=1e-4, atol=1e-4)
    unclamped = discretize_dt(dt, dt_bias, True)
    assert not torch.allclose(unclamped, dt_ref), "the limit must bite in this test"


def test_per_channel_D_and_plain_returns():
    x, dt, A, B, C, _, _, _, _ = make_inputs(9, seed=8)
    D = torch.randn(NHEADS, HEADDIM)
    out = mamba_chunk_scan_combined(x, dt.abs(), A, B, C, 4, D)
    zeros = torch.zeros(BATCH, NHEADS, HEADDIM, DSTATE)
    y_ref, _ = reference_ssd(x, dt.abs(), A, B, C, D, None, zeros)
    torch.testing.assert_close(out, y_ref, rtol=1e-4, atol=1e-4)
    res = mamba_chunk_scan_combined(x, dt.abs(), A, B, C, 4, D, emit_positions=[])
    assert res.emitted_states.shape == (BATCH, 0, NHEADS, HEADDIM, DSTATE)
    empty = mamba_chunk_scan_combined(x[:, :0], dt[:, :0], A, B[:, :0], C[:, :0], 4,
                                      emit_positions=[0])
    assert empty.out.shape == (BATCH, 0, NHEADS, HEADDIM)
    torch.testing.assert_close(empty.final_state, zeros)


def test_matches_transformers_torch_chunk_scan():
    modeling = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
    x, dt, A, B, C, D, _, dt_bias, h0 = make_inputs(37, 2, seed=9)
    want = modeling.mamba2_chunk_scan(x, dt, A, B, C, chunk_size=8, D=D, dt_bias=dt_bias,
                                      initial_states=h0, dt_softplus=True,
                                      dt_limit=(0.05, 2.0), return_final_states=True)
    got = mamba_chunk_scan_combined(x, dt, A, B, C, 8, D, None, dt_bias, h0,
                                    dt_softplus=True, dt_limit=(0.05, 2.0),
                                    return_final_states=True)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("d_shape", ["head", "channel"])
def test_decode_update_equals_one_token_scans(d_shape):
    x, dt, A, B, C, D, z, dt_bias, h0 = make_inputs(5, 2, seed=10)
    D = D if d_shape == "head" else torch.randn(NHEADS, HEADDIM)
    res = mamba_chunk_scan_combined(x, dt, A, B, C, 4, D, z, dt_bias, h0, dt_softplus=True,
                                    emit_positions=[1, 2, 3, 4, 5])
    state = h0.clone()
    for t in range(5):
        out = ssd_state_update(state, x[:, t], dt[:, t], A, B[:, t], C[:, t], D, z[:, t],
                               dt_bias, True)
        torch.testing.assert_close(out, res.out[:, t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state, res.emitted_states[:, t], rtol=1e-5, atol=1e-5)


def test_decode_clamps_only_when_asked():
    x, dt, A, B, C, _, _, dt_bias, h0 = make_inputs(1, seed=12)
    limit = (0.6, 0.7)
    scan_out, scan_state = mamba_chunk_scan_combined(
        x, dt, A, B, C, 4, None, None, dt_bias, h0, dt_softplus=True, dt_limit=limit,
        return_final_states=True)
    state = h0.clone()
    out = ssd_state_update(state, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], None, None, dt_bias,
                           True, dt_limit=limit)
    torch.testing.assert_close(out, scan_out[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, scan_state, rtol=1e-5, atol=1e-5)
    free = h0.clone()
    ssd_state_update(free, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], None, None, dt_bias, True)
    assert not torch.allclose(free, state)


def start_state_kernel(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, **kwargs):
    """Stands in for the CUDA ``mamba_chunk_scan_combined``."""
    return mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                     **kwargs)


def test_segmented_dispatch_chains_states():
    x, dt, A, B, C, D, z, dt_bias, h0 = make_inputs(30, 2, seed=14)
    positions = [0, 8, 13, 30]
    got = mamba_gpu.chunk_scan_segments(start_state_kernel, x, dt, A, B, C, 8, D, z, dt_bias,
                                        h0, True, (0.0, float("inf")), positions)
    want = mamba_chunk_scan_combined(x, dt, A, B, C, 8, D, z, dt_bias, h0, dt_softplus=True,
                                     emit_positions=positions)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("positions", "match"), [([9, 4], "increasing"), ([21], "outside")])
def test_bad_emit_positions_raise(positions, match):
    x, dt, A, B, C, *_ = make_inputs(20)
    with pytest.raises(ValueError, match=match):
        mamba_chunk_scan_combined(x, dt, A, B, C, 8, emit_positions=positions)


def test_inconsistent_shapes_raise():
    x, dt, A, B, C, D, z, dt_bias, h0 = make_inputs(10, 2)
    base = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "chunk_size": 4}
    cases = [
        ({"dt": dt[:, :9]}, "dt must"),
        ({"A": A[:2]}, "A must"),
        ({"B": B[:, :9]}, "B must"),
        ({"B": torch.randn(BATCH, 10, 3, DSTATE)}, "multiple of the 3 groups"),
        ({"C": C[..., :2]}, "C must"),
        ({"D": torch.randn(NHEADS, 2)}, "D must"),
        ({"z": z[:, :, :2]}, "z must"),
        ({"initial_states": h0[..., :2]}, "initial_states"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"x": x[0]}, "x must"),
        ({"seq_idx": torch.zeros(BATCH, 10, dtype=torch.int32)}, "packed"),
    ]
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            mamba_chunk_scan_combined(**(base | change))
    with pytest.raises(ValueError, match="dt must"):
        ssd_state_update(h0.clone(), x[:, 0], dt[:, :2], A, B[:, 0], C[:, 0])
    with pytest.raises(ValueError, match="state must"):
        ssd_state_update(h0[0].clone(), x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0])


def test_dispatch_decode_falls_back_to_torch_on_cpu():
    x, dt, A, B, C, D, z, dt_bias, h0 = make_inputs(1, 2, seed=15)
    s1, s2 = h0.clone(), h0.clone()
    out1 = ssd_state_update(s1, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, z[:, 0], dt_bias, True)
    out2 = mamba_gpu.ssd_state_update(s2, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, z[:, 0],
                                      dt_bias, True)
    torch.testing.assert_close(out2, out1)
    torch.testing.assert_close(s2, s1)
