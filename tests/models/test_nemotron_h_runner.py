"""NemotronH (Mamba-2 hybrid) runner against the Hugging Face model's own full-sequence forward."""

import pytest
from hybrid_harness import (
    ALL_CHECKS,
    check_chunked_prefill_and_decode,
    check_resume_from_checkpoint,
    greedy_generate,
    random_tokens,
)
from paged_harness import build_model, hf_generate

from hybridkv.kv_cache.specs import FullAttentionSpec, MambaSpec
from hybridkv.models import load_model
from hybridkv.models.nemotron_h import NemotronHRunner
from hybridkv.models.presets import get_preset
from hybridkv.testing.models import slow_decay


@pytest.fixture(scope="module")
def nemotron():
    model = build_model("nemotron-h-tiny")
    slow_decay(model)
    return model, load_model(model)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__)
def test_matches_hf(nemotron, check):
    check(*nemotron)


def test_layout(nemotron):
    _, runner = nemotron
    assert isinstance(runner, NemotronHRunner)
    specs = runner.kv_cache_specs(16)
    assert list(specs) == ["layers.0.mamba", "layers.2.attn", "layers.3.mamba"]
    # conv over x, B and C: 128 + 2 groups * 2 * 16 channels; SSM [nheads, headdim, d_state]
    assert specs["layers.0.mamba"] == MambaSpec(16, shapes=((192, 3), (8, 16, 16)))
    assert isinstance(specs["layers.2.attn"], FullAttentionSpec)
    assert runner.kinds == ["mamba", "ffn", "attention", "mamba", "ffn"]


def test_preset_loads_by_name():
    runner = load_model("nemotron-h-tiny")
    assert isinstance(runner, NemotronHRunner)
    assert runner.max_model_len == get_preset("nemotron-h-tiny").max_model_len


def test_hf_generate_agrees(nemotron):
    # HF's cached decode leaves dt unclamped (we clamp, as its full-sequence scan does);
    # the difference is far too small to change a greedy token here
    model, runner = nemotron
    prompt = random_tokens(33, seed=21)
    assert greedy_generate(runner, prompt, 8, 13) == hf_generate(model, prompt, 8)


def test_other_pattern_groups_and_clamped_dt():
    # attention first, one group, biases, SSD chunks of 8; time_step_min=0.05 makes the dt
    # clamp bind often, which decode steps must apply as the full-sequence scan does
    model = build_model("nemotron-h-tiny", seed=1, n_groups=1, use_conv_bias=False,
                        use_bias=True, chunk_size=8, time_step_min=0.05,
                        layers_block_type=["full_attention", "linear_attention", "mlp",
                                           "linear_attention"])
    slow_decay(model)
    runner = load_model(model)
    assert list(runner.kv_cache_specs(4)) == ["layers.0.attn", "layers.1.mamba", "layers.3.mamba"]
    assert runner.mamba_layers[1].conv_shape == (160, 3)
    check_chunked_prefill_and_decode(model, runner, length=84, chunk_sizes=(37, 5, 30),
                                     boundaries=(8, 40, 72, 80))
    check_resume_from_checkpoint(model, runner)


def test_unsupported_activation_refused():
    with pytest.raises(ValueError, match="mamba_hidden_act"):
        load_model(build_model("nemotron-h-tiny", mamba_hidden_act="gelu"))
