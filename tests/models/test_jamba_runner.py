"""Jamba runner against the Hugging Face model's own forward over the full sequence, no cache.

(HF's cached multi-token forward restarts the Mamba scan from zero, so it is
never the reference for a continuation.)
"""

import pytest
import torch
from hybrid_harness import (
    ALL_CHECKS,
    HybridCache,
    check_chunked_prefill_and_decode,
    greedy_generate,
    random_tokens,
)
from paged_harness import PagedCache, build_model, hf_generate

from hybridkv.kernels.attention import AttentionBatch
from hybridkv.kv_cache.specs import FullAttentionSpec, MambaSpec
from hybridkv.models import load_model
from hybridkv.models.jamba import JambaRunner
from hybridkv.models.mamba_batch import MambaBatch
from hybridkv.models.presets import get_preset
from hybridkv.testing.models import slow_decay


@pytest.fixture(scope="module")
def jamba():
    model = build_model("jamba-tiny")
    slow_decay(model)
    return model, load_model(model)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__)
def test_matches_hf(jamba, check):
    check(*jamba)


def test_layout(jamba):
    _, runner = jamba
    assert isinstance(runner, JambaRunner)
    specs = runner.kv_cache_specs(16)
    assert list(specs) == ["layers.0.mamba", "layers.1.mamba", "layers.2.attn", "layers.3.mamba"]
    assert specs["layers.0.mamba"] == MambaSpec(16, shapes=((128, 3), (128, 16)))
    assert isinstance(specs["layers.2.attn"], FullAttentionSpec)
    assert [layer.rope_key for layer in runner.attn_layers] == [None]
    assert runner.model.config.layers_num_experts == [1, 4, 1, 4]


def test_preset_loads_by_name():
    runner = load_model("jamba-tiny")
    assert isinstance(runner, JambaRunner)
    assert runner.max_model_len == get_preset("jamba-tiny").max_model_len


def test_hf_generate_agrees(jamba):
    # HF's generate prefills from a zero state and decodes one token at a time: correct here
    model, runner = jamba
    prompt = random_tokens(33, seed=21)
    assert greedy_generate(runner, prompt, 8, 13) == hf_generate(model, prompt, 8)


def test_other_layout_and_biases():
    # attention first, MoE on every layer, no conv bias, projection biases
    model = build_model("jamba-tiny", num_hidden_layers=3, attn_layer_period=3,
                        attn_layer_offset=0, expert_layer_period=1, expert_layer_offset=0,
                        mamba_conv_bias=False, mamba_proj_bias=True, mamba_d_conv=3, seed=1)
    slow_decay(model)
    runner = load_model(model)
    assert list(runner.kv_cache_specs(4)) == ["layers.0.attn", "layers.1.mamba", "layers.2.mamba"]
    assert runner.mamba_layers[1].conv_shape == (128, 2)
    check_chunked_prefill_and_decode(model, runner, length=84, chunk_sizes=(37, 5, 30),
                                     boundaries=(8, 40, 72, 80))


def test_unsupported_activation_refused():
    with pytest.raises(ValueError, match="hidden_act"):
        load_model(build_model("jamba-tiny", hidden_act="gelu"))


def test_bad_mamba_batch_refused(jamba):
    _, runner = jamba
    cache = HybridCache(runner)
    assert cache.step({"a": random_tokens(5)})["a"].shape == (5, runner.vocab_size)
    ids, positions = torch.tensor(random_tokens(3)), torch.arange(3)
    attn_batch = AttentionBatch(torch.tensor([0, 3], dtype=torch.int32),
                                torch.tensor([3], dtype=torch.int32),
                                torch.tensor([[1]], dtype=torch.int32), torch.arange(4, 7))
    attn = {layer.name: attn_batch for layer in runner.attn_layers}
    good = dict(query_start_loc=[0, 3], live_blocks=[5], source_blocks=[None],
                has_initial_state=[False], checkpoints=[[(2, 7)]])
    bad_values = [("query_start_loc", [0, 2]), ("checkpoints", [[(4, 7)]]),
                  ("checkpoints", [[(2, 7), (1, 8)]]), ("source_blocks", [None, None]),
                  ("query_start_loc", [0, 0, 3])]
    for field, value in bad_values:
        batch = MambaBatch(**{**good, field: value})
        mamba = {layer.name: batch for layer in runner.mamba_layers.values()}
        with pytest.raises(ValueError, match="MambaBatch"):
            runner.forward(ids, positions, attn, torch.arange(3), mamba_batches=mamba)
    with pytest.raises(ValueError, match="layers.0.mamba"):
        runner.forward(ids, positions, attn, torch.arange(3))


def test_bad_state_views_refused(jamba):
    _, runner = jamba
    views = {name: (torch.zeros(8, 4, 2, 16), torch.zeros(8, 4, 2, 16))
             for name in ("layers.2.attn",)}
    with pytest.raises(ValueError, match="layers.0.mamba"):
        runner.bind_kv_cache(views)
    views.update({f"layers.{i}.mamba": (torch.zeros(8, 128, 3), torch.zeros(8, 16, 128))
                  for i in (0, 1, 3)})
    with pytest.raises(ValueError, match="shapes"):
        runner.bind_kv_cache(views)


def test_attention_only_runner_refuses_mamba_batches():
    runner = load_model(build_model("mistral-tiny"))
    cache = PagedCache(runner)
    batch = MambaBatch([0, 1], [1], [None], [False], [[]])
    with pytest.raises(ValueError, match="no Mamba layers"):
        runner.forward(torch.tensor([5]), torch.tensor([0]), {}, torch.tensor([0]),
                       mamba_batches={"layers.0.mamba": batch})
    assert cache.step({"a": [5, 6]})["a"].shape == (2, runner.vocab_size)
