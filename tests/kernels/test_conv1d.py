"""Causal conv1d against a token-by-token sliding-window reference."""

from __future__ import annotations

import pytest
import torch

from hybridkv.kernels import mamba_gpu
from hybridkv.kernels.conv1d import (
    SpanOutput,
    causal_conv1d_fn,
    causal_conv1d_update,
    check_emit_positions,
)

BATCH, DIM = 2, 6


def reference_conv(x, weight, bias, start, activation):
    """Plain sliding window: returns outputs and the window after every token.

    x: [batch, dim, L]; start: [batch, dim, width - 1]. windows[k] is the
    state after k tokens (windows[0] == start).
    """
    window = [start[..., j] for j in range(start.shape[-1])]
    windows, outs = [torch.stack(window, -1) if window else start.clone()], []
    for t in range(x.shape[-1]):
        full = window + [x[..., t]]
        acc = sum(weight[:, j] * full[j] for j in range(weight.shape[1]))
        if bias is not None:
            acc = acc + bias
        if activation == "silu":
            acc = acc * torch.sigmoid(acc)
        outs.append(acc)
        window = full[1:]
        windows.append(torch.stack(window, -1) if window else start.clone())
    return torch.stack(outs, -1), windows


def make_inputs(seqlen, width, seed=0, with_bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, DIM, seqlen, generator=g)
    weight = torch.randn(DIM, width, generator=g)
    bias = torch.randn(DIM, generator=g) if with_bias else None
    start = torch.randn(BATCH, DIM, width - 1, generator=g)
    return x, weight, bias, start


@pytest.mark.parametrize("seqlen", [1, 3, 17, 64])
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_matches_reference_with_emitted_states(seqlen, width, activation):
    x, weight, bias, start = make_inputs(seqlen, width, seed=seqlen * 10 + width)
    positions = sorted({0, 1, seqlen // 2, seqlen})
    res = causal_conv1d_fn(x, weight, bias, initial_states=start, activation=activation,
                           emit_positions=positions)
    ref_out, windows = reference_conv(x, weight, bias, start, activation)
    assert isinstance(res, SpanOutput)
    torch.testing.assert_close(res.out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res.final_state, windows[seqlen])
    assert res.emitted_states.shape == (BATCH, len(positions), DIM, width - 1)
    for i, pos in enumerate(positions):
        torch.testing.assert_close(res.emitted_states[:, i], windows[pos])


def test_no_initial_state_means_zeros():
    x, weight, bias, _ = make_inputs(9, 4, with_bias=False)
    zeros = torch.zeros(BATCH, DIM, 3)
    out = causal_conv1d_fn(x, weight, None, activation="silu")
    ref_out, _ = reference_conv(x, weight, None, zeros, "silu")
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)


def test_initial_state_changes_only_the_first_outputs():
    x, weight, bias, start = make_inputs(12, 4)
    with_start = causal_conv1d_fn(x, weight, bias, initial_states=start)
    without = causal_conv1d_fn(x, weight, bias)
    assert not torch.allclose(with_start[..., :3], without[..., :3])
    torch.testing.assert_close(with_start[..., 3:], without[..., 3:])


@pytest.mark.parametrize("split", [1, 2, 7, 19])
def test_split_span_resumes_from_emitted_state(split):
    x, weight, bias, start = make_inputs(20, 4, seed=3)
    whole = causal_conv1d_fn(x, weight, bias, initial_states=start, activation="silu",
                             emit_positions=[split])
    first = causal_conv1d_fn(x[..., :split], weight, bias, initial_states=start,
                             activation="silu", return_final_states=True)
    second = causal_conv1d_fn(x[..., split:], weight, bias,
                              initial_states=whole.emitted_states[:, 0], activation="silu",
                              return_final_states=True)
    torch.testing.assert_close(first[1], whole.emitted_states[:, 0])
    torch.testing.assert_close(torch.cat([first[0], second[0]], -1), whole.out)
    torch.testing.assert_close(second[1], whole.final_state)


def test_return_conventions_follow_the_package():
    x, weight, bias, start = make_inputs(5, 3)
    out = causal_conv1d_fn(x, weight, bias, None, start)
    assert isinstance(out, torch.Tensor) and out.shape == x.shape
    sink = torch.empty(BATCH, DIM, 2)
    out2, final = causal_conv1d_fn(x, weight, bias, None, start, True, sink)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(final, x[..., -2:])
    torch.testing.assert_close(sink, final)
    empty = causal_conv1d_fn(x, weight, bias, initial_states=start, emit_positions=[])
    assert empty.emitted_states.shape == (BATCH, 0, DIM, 2)


def test_short_span_state_keeps_older_inputs():
    x, weight, bias, start = make_inputs(2, 4)
    _, final = causal_conv1d_fn(x, weight, bias, initial_states=start,
                                return_final_states=True)
    torch.testing.assert_close(final, torch.cat([start[..., 2:], x], -1))


@pytest.mark.parametrize("state_len_extra", [0, 1, 3])
def test_update_steps_equal_the_span(state_len_extra):
    x, weight, bias, start = make_inputs(10, 4, seed=5)
    ref_out, windows = reference_conv(x, weight, bias, start, "silu")
    older = torch.randn(BATCH, DIM, state_len_extra)
    conv_state = torch.cat([older, start], -1)  # longer states keep more history
    for t in range(10):
        out = causal_conv1d_update(x[..., t], conv_state, weight, bias, "silu")
        assert out.shape == (BATCH, DIM)
        torch.testing.assert_close(out, ref_out[..., t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(conv_state[..., -3:], windows[t + 1])


def test_multi_token_update_equals_span():
    x, weight, bias, start = make_inputs(6, 4, seed=6)
    conv_state = start.clone()
    out = causal_conv1d_update(x, conv_state, weight, bias, None)
    ref_out, windows = reference_conv(x, weight, bias, start, None)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(conv_state, windows[6])


def test_width_one_has_empty_state():
    x, weight, bias, _ = make_inputs(4, 1)
    res = causal_conv1d_fn(x, weight, bias, emit_positions=[2])
    torch.testing.assert_close(res.out, x * weight + bias[:, None])
    assert res.final_state.shape == (BATCH, DIM, 0)
    state = torch.zeros(BATCH, DIM, 0)
    torch.testing.assert_close(causal_conv1d_update(x[..., 0], state, weight, bias),
                               res.out[..., 0])


@pytest.mark.parametrize(
    ("positions", "match"),
    [([5, 3], "increasing"), ([2, 2], "increasing"), ([9], "outside"), ([-1], "outside"),
     ([1.5], "ints")],
)
def test_bad_emit_positions_raise(positions, match):
    x, weight, bias, _ = make_inputs(8, 4)
    with pytest.raises(ValueError, match=match):
        causal_conv1d_fn(x, weight, bias, emit_positions=positions)
    with pytest.raises(ValueError, match=match):
        check_emit_positions(positions, 8)


def test_inconsistent_shapes_raise():
    x, weight, bias, start = make_inputs(8, 4)
    with pytest.raises(ValueError, match="weight"):
        causal_conv1d_fn(x, weight[:3], bias)
    with pytest.raises(ValueError, match="bias"):
        causal_conv1d_fn(x, weight, bias[:2])
    with pytest.raises(ValueError, match="initial_states"):
        causal_conv1d_fn(x, weight, bias, initial_states=start[..., :2])
    with pytest.raises(ValueError, match="x must be"):
        causal_conv1d_fn(x[0], weight, bias)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_fn(x, weight, bias, activation="relu")
    with pytest.raises(ValueError, match="seq_idx"):
        causal_conv1d_fn(x, weight, bias, torch.zeros(BATCH, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="width 4 needs 3"):
        causal_conv1d_update(x[..., 0], start[..., :2].clone(), weight, bias)
    with pytest.raises(ValueError, match="conv_state"):
        causal_conv1d_update(x[..., 0], start[:1].clone(), weight, bias)


def test_dispatch_falls_back_to_torch_on_cpu():
    x, weight, bias, start = make_inputs(11, 4, seed=8)
    want = causal_conv1d_fn(x, weight, bias, initial_states=start, activation="silu",
                            emit_positions=[4, 8])
    got = mamba_gpu.causal_conv1d_fn(x, weight, bias, initial_states=start, activation="silu",
                                     emit_positions=[4, 8])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    state = start.clone()
    out = mamba_gpu.causal_conv1d_update(x[..., 0], state, weight, bias, "silu")
    torch.testing.assert_close(out, want.out[..., 0])
