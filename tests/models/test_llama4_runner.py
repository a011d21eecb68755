"""Llama 4 text runner (chunked local + NoPE global, MoE) against the Hugging Face forward."""

import pytest
import torch
from paged_harness import (
    ALL_CHECKS,
    build_model,
    check_chunked_prefill_and_decode,
    check_null_blocks_never_read,
    spec_kinds,
)

from hybridkv.models import Llama4Runner, load_model


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__)
def test_matches_hf(check):
    model = build_model("llama4-tiny")
    check(model, load_model(model))


def test_layout():
    model = build_model("llama4-tiny")
    runner = load_model(model)
    assert isinstance(runner, Llama4Runner)
    assert spec_kinds(runner) == [("chunked", 32)] * 3 + [("full",)]
    assert [layer.rope_key is None for layer in runner.attn_layers] == [False] * 3 + [True]
    assert [layer.is_moe_layer for layer in model.model.layers] == [False, True, False, True]


def test_attention_temperature_formula():
    runner = load_model(build_model("llama4-tiny"))  # floor_scale 16, attn_scale 0.1
    positions = torch.tensor([0, 14, 15, 31, 47, 100])
    expected = torch.tensor([1.0, 1.0] + [1.0 + 0.1 * torch.log1p(torch.tensor(n)).item()
                                          for n in (1.0, 2.0, 3.0, 6.0)])
    torch.testing.assert_close(runner.attention_temperature(positions), expected)


@pytest.mark.parametrize("overrides", [
    {"use_qk_norm": False, "attn_temperature_tuning": False},
    {"interleave_moe_layer_step": 1, "num_experts_per_tok": 2, "floor_scale": 8},
    {"no_rope_layers": [1, 0, 1, 0], "attention_chunk_size": 16},
], ids=["no-qk-norm-no-temperature", "all-moe-top2", "two-nope-layers"])
def test_variants_match_hf(overrides):
    model = build_model("llama4-tiny", **overrides)
    runner = load_model(model)
    check_chunked_prefill_and_decode(model, runner, length=70, chunk_sizes=(21, 30))
    check_null_blocks_never_read(model, runner, length=60, chunk_sizes=(35,), block_size=8)


def test_chunk_must_be_a_multiple_of_block_size():
    runner = load_model(build_model("llama4-tiny"))
    with pytest.raises(ValueError, match="attention_chunk_size"):
        runner.kv_cache_specs(block_size=6)
