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
    candidates = [getattr(layer.self_attn, name) for layer in layers
                  for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    candidates += [getattr(layer.mlp, name) for layer in layers
                   for name in ("gate_proj", "up_proj", "down_proj")]
    candidates.append(runner.model.lm_head)
    expected = sum(m.weight.numel() >= packed_linear.MIN_WEIGHT_ELEMENTS for m in candidates)
    assert 0 < expected < len(candidates)  # k/v projections of this shape are too small
    assert runner.prepack_weights() == expected
    assert runner.prepack_weights() == expected  # packing twice adds nothing


def wide_gemma3(seed=0):
    """gemma3-tiny widened until most of its weights are large enough to pack."""
    from transformers import AutoModelForCausalLM

    from hybridkv.models.presets import get_preset

    config = get_preset("gemma3-tiny").build_config(
        hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=1,
        head_dim=64)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()
