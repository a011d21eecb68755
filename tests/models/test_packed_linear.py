"""Prepacked linear weights: same products as the module, used for steps of 2 rows or more."""

import pytest
import torch
from torch import nn

from hybridkv.models import packed_linear
from hybridkv.models.packed_linear import PackedLinears, can_prepack, gated_mlp_parts

needs_onednn = pytest.mark.skipif(not can_prepack(nn.Linear(256, 256)),
                                  reason="oneDNN cannot pack weights here")


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_packed_product_matches_linear(bias):
    torch.manual_seed(0)
    linear = nn.Linear(256, 320, bias=bias)
    linears = PackedLinears()
    assert linears.add(linear) and not linears.add(linear)
    for rows in (1, 2, 8, 64, 65, 700):
        x = torch.randn(rows, 256)
        torch.testing.assert_close(linears.apply(linear, x), linear(x), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_steps_of_two_rows_or_more_use_the_packed_copy():
    linear = nn.Linear(256, 256)
    linears = PackedLinears()
    linears.add(linear)
    with torch.no_grad():
        linear.weight.zero_()  # the packed copy keeps the old weights
    for rows, packed in ((1, False), (2, True), (64, True), (700, True)):
        out = linears.apply(linear, torch.ones(rows, 256))
        assert bool((out != linear.bias).any()) == packed, rows
    assert packed_linear.MIN_ROWS == 2


def test_what_is_not_packed():
    linears = PackedLinears()
    assert not linears.add(None)
    assert not linears.add(nn.Linear(256, 256).double())
    assert not linears.add(nn.Linear(64, 128))  # too small to gain
    assert not linears.add(nn.Conv1d(2, 2, 1))
    assert len(linears) == 0
    x = torch.randn(4, 4, dtype=torch.float64)
    module = nn.Linear(4, 4).double()
    assert torch.equal(linears.apply(module, x), module(x))


def test_gated_mlp_parts_only_for_the_gated_shape():
    class GatedMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = (nn.Linear(4, 6), nn.Linear(4, 6),
                                                            nn.Linear(6, 4))
            self.act_fn = nn.GELU()

    class OtherMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj, self.down_proj = nn.Linear(4, 6), nn.Linear(6, 4)
            self.act_fn = nn.ReLU()

    mlp = GatedMLP()
    assert gated_mlp_parts(mlp) == (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    assert gated_mlp_parts(OtherMLP()) is None
    assert gated_mlp_parts(None) is None


@needs_onednn
def test_runner_packs_its_large_projections_only():
    from hybridkv.models.registry import load_model

    runner = load_model(wide_gemma3())
    layers = runner.decoder.layers
    groups = [[getattr(layer.self_attn, name) for name in ("q_proj", "k_proj", "v_proj")]
              for layer in layers]  # stacked: packed when the stack is large enough
    groups += [[layer.mlp.gate_proj, layer.mlp.up_proj] for layer in layers]
    alone = [layer.self_attn.o_proj for layer in layers] + [layer.mlp.down_proj
                                                            for layer in layers]
    alone.append(runner.model.lm_head)
    large = packed_linear.MIN_WEIGHT_ELEMENTS
    assert any(m.weight.numel() < large for g in groups for m in g)  # k/v alone too small
    expected = sum(len(g) for g in groups if sum(m.weight.numel() for m in g) >= large)
    expected += sum(m.weight.numel() >= large for m in alone)
    assert runner.prepack_weights() == expected
    assert runner.prepack_weights() == expected  # packing twice adds nothing
    assert all(runner.linears.is_fused(g) for g in groups)


def wide_gemma3(seed=0):
    """gemma3-tiny widened until most of its weights are large enough to pack."""
    from transformers import AutoModelForCausalLM

    from hybridkv.models.presets import get_preset

    config = get_preset("gemma3-tiny").build_config(
        hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=1,
        head_dim=64)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_fused_products_match_each_linear(bias):
    torch.manual_seed(0)
    q, k, v = nn.Linear(256, 256, bias=bias), nn.Linear(256, 64, bias=bias), \
        nn.Linear(256, 64, bias=bias)
    linears = PackedLinears()
    assert linears.add_fused([q, k, v]) and len(linears) == 3
    for rows in (1, 2, 8, 700):
        x = torch.randn(rows, 256)
        outs = linears.apply_all((q, k, v), x)
        assert [tuple(o.shape) for o in outs] == [(rows, 256), (rows, 64), (rows, 64)]
        for out, module in zip(outs, (q, k, v)):
            torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_fused_steps_of_two_rows_or_more_use_the_stacked_copy():
    gate, up = nn.Linear(256, 256), nn.Linear(256, 256)
    linears = PackedLinears()
    linears.add_fused([gate, up])
    with torch.no_grad():
        up.weight.zero_()  # the stacked copy keeps the old weights
    for rows, packed in ((1, False), (2, True), (64, True)):
        _, out = linears.apply_all((gate, up), torch.ones(rows, 256))
        assert bool((out != up.bias).any()) == packed, rows


@needs_onednn
def test_what_is_not_fused():
    linears = PackedLinears()
    small = [nn.Linear(64, 64), nn.Linear(64, 64)]  # stacked below MIN_WEIGHT_ELEMENTS
    mixed_bias = [nn.Linear(256, 256), nn.Linear(256, 256, bias=False)]
    widths = [nn.Linear(256, 256), nn.Linear(128, 256)]
    half = [nn.Linear(256, 256), nn.Linear(256, 256).double()]
    for group in (small, mixed_bias, widths, half, [nn.Linear(256, 256)], [None, None]):
        assert not linears.add_fused(group)
    assert len(linears) == 0
    x = torch.randn(4, 64)
    outs = linears.apply_all(small, x)  # not fused: each module runs itself
    for out, module in zip(outs, small):
        assert torch.equal(out, module(x))
