"""gpt-oss runner (sinks + sliding window, MoE, YaRN) against the Hugging Face forward."""

import pytest
import torch
from paged_harness import (
    ALL_CHECKS,
    build_model,
    check_chunked_prefill_and_decode,
    check_null_blocks_never_read,
    spec_kinds,
)

from hybridkv.models import GptOssRunner, load_model


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__)
def test_matches_hf(check):
    model = build_model("gpt-oss-tiny")
    check(model, load_model(model))


def test_layout():
    runner = load_model(build_model("gpt-oss-tiny"))
    assert isinstance(runner, GptOssRunner)
    assert spec_kinds(runner) == [("sliding", 32), ("full",)] * 2
    assert runner.rotaries["default"].attention_scaling > 1.0  # YaRN attention factor


def test_strong_sinks_match_hf():
    model = build_model("gpt-oss-tiny", seed=3)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.linspace(-2.0, 4.0, layer.self_attn.sinks.numel()))
    runner = load_model(model)
    check_null_blocks_never_read(model, runner, chunk_sizes=(50, 3))


def test_default_yarn_config_matches_hf():
    # the config's own default rope: YaRN, factor 32 over 4096 positions, truncate=False
    model = build_model("gpt-oss-tiny", rope_parameters=None, sliding_window=20)
    runner = load_model(model)
    assert spec_kinds(runner) == [("sliding", 20), ("full",)] * 2
    check_chunked_prefill_and_decode(model, runner, length=60, chunk_sizes=(7, 25))
