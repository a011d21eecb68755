"""Qwen2 / Mistral runners (optional sliding window) against the Hugging Face forward."""

import pytest
from paged_harness import (
    ALL_CHECKS,
    build_model,
    check_chunked_prefill_and_decode,
    check_null_blocks_never_read,
    spec_kinds,
)

from hybridkv.models import MistralRunner, Qwen2Runner, load_model


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("preset", ["qwen2-tiny", "mistral-tiny"])
def test_matches_hf(preset, check):
    model = build_model(preset)
    check(model, load_model(model))


def test_qwen2_window_on_layers_from_max_window_layers():
    runner = load_model(build_model("qwen2-tiny"))
    assert isinstance(runner, Qwen2Runner)
    assert spec_kinds(runner) == [("full",)] * 2 + [("sliding", 32)] * 2


def test_qwen2_explicit_layer_types():
    layer_types = ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]
    model = build_model("qwen2-tiny", layer_types=layer_types, sliding_window=24)
    runner = load_model(model)
    assert spec_kinds(runner) == [("sliding", 24), ("full",), ("full",), ("sliding", 24)]
    check_null_blocks_never_read(model, runner, chunk_sizes=(30, 17, 2))


def test_qwen2_without_sliding_window_is_all_full():
    model = build_model("qwen2-tiny", use_sliding_window=False)
    runner = load_model(model)
    assert spec_kinds(runner) == [("full",)] * 4
    check_null_blocks_never_read(model, runner, expect_dropped=False)


def test_mistral_layouts():
    runner = load_model(build_model("mistral-tiny"))
    assert isinstance(runner, MistralRunner)
    assert spec_kinds(runner) == [("sliding", 32)] * 3
    model = build_model("mistral-tiny", sliding_window=None, num_key_value_heads=4)
    runner = load_model(model)
    assert spec_kinds(runner) == [("full",)] * 3
    check_chunked_prefill_and_decode(model, runner, length=50, chunk_sizes=(20, 20))


def test_qwen2_block_size_16():
    model = build_model("qwen2-tiny", seed=5)
    check_chunked_prefill_and_decode(model, load_model(model), chunk_sizes=(17, 40),
                                     block_size=16)
