"""Gemma 2 / Gemma 3 runners against the Hugging Face model's own forward."""

import pytest
from paged_harness import (
    ALL_CHECKS,
    build_model,
    check_chunked_prefill_and_decode,
    check_null_blocks_never_read,
    spec_kinds,
)

from hybridkv.models import Gemma2Runner, Gemma3Runner, load_model


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("preset", ["gemma2-tiny", "gemma3-tiny"])
def test_matches_hf(preset, check):
    model = build_model(preset)
    check(model, load_model(model))


def test_gemma2_layout():
    runner = load_model(build_model("gemma2-tiny"))
    assert isinstance(runner, Gemma2Runner)
    assert spec_kinds(runner) == [("sliding", 32), ("full",)] * 2
    assert {layer.softcap for layer in runner.attn_layers} == {50.0}
    assert {layer.scale for layer in runner.attn_layers} == {32 ** -0.5}


def test_gemma3_layout():
    runner = load_model(build_model("gemma3-tiny"))
    assert isinstance(runner, Gemma3Runner)
    assert spec_kinds(runner) == [("sliding", 32)] * 3 + [("full",)]
    assert [layer.rope_key for layer in runner.attn_layers] == (
        ["sliding_attention"] * 3 + ["full_attention"])
    assert {layer.softcap for layer in runner.attn_layers} == {None}


def test_gemma3_default_pattern_and_softcap_config():
    # layer_types from the legacy sliding_window_pattern; HF's Gemma 3 ignores attention softcap
    model = build_model("gemma3-tiny", layer_types=None, sliding_window_pattern=3,
                        num_hidden_layers=6, attn_logit_softcapping=20.0,
                        final_logit_softcapping=5.0)
    runner = load_model(model)
    assert spec_kinds(runner) == [("sliding", 32), ("sliding", 32), ("full",)] * 2
    check_chunked_prefill_and_decode(model, runner, length=70, chunk_sizes=(33, 9))


def test_gemma2_wide_window_drops_nothing():
    model = build_model("gemma2-tiny", sliding_window=128)
    runner = load_model(model)
    check_null_blocks_never_read(model, runner, expect_dropped=False)


def test_bidirectional_gemma3_refused():
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        load_model(build_model("gemma3-tiny", use_bidirectional_attention=True))
