"""load_model, presets, the runner registry and the runner's input checks."""

import json

import pytest
import torch
from paged_harness import PagedCache, build_model, hf_logits, random_tokens
from transformers import LlamaConfig, LlamaForCausalLM

from hybridkv.models import (
    Gemma3Runner,
    ModelRunner,
    get_runner_class,
    list_presets,
    load_model,
    register_runner,
    supported_model_types,
)
from hybridkv.models import registry as registry_module
from hybridkv.models.presets import get_preset

EXPECTED_PRESETS = {"gemma3-tiny", "gemma2-tiny", "qwen2-tiny", "mistral-tiny", "llama4-tiny",
                    "gpt-oss-tiny"}


def test_presets_listed_and_supported():
    assert EXPECTED_PRESETS <= set(list_presets())
    assert {"gemma2", "gemma3_text", "qwen2", "mistral", "llama4_text",
            "gpt_oss"} <= set(supported_model_types())


@pytest.mark.parametrize("preset", sorted(EXPECTED_PRESETS))
def test_load_preset(preset):
    runner = load_model(preset, seed=0)
    assert isinstance(runner, get_runner_class(runner.model_type))
    assert not runner.model.training
    assert runner.dtype == torch.float32
    assert runner.max_model_len == get_preset(preset).max_model_len
    assert runner.vocab_size == 512
    assert runner.eos_token_ids == (2,)
    hidden = runner.model.config.hidden_size
    assert 64 <= hidden <= 128 and 2 <= runner.model.config.num_hidden_layers <= 6
    kinds = {type(spec).__name__ for spec in runner.kv_cache_specs(16).values()}
    assert len(kinds) == 2 or preset == "mistral-tiny"  # hybrids mix two attention types


def test_preset_seed_is_deterministic():
    first, again, other = (load_model("gemma3-tiny", seed=seed).model.lm_head.weight
                           for seed in (7, 7, 8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_preset_dtype():
    runner = load_model("qwen2-tiny", dtype=torch.bfloat16)
    assert runner.dtype == torch.bfloat16
    assert {spec.dtype for spec in runner.kv_cache_specs(8).values()} == {"bfloat16"}


def test_wrapped_model_shares_weights():
    model = build_model("gpt-oss-tiny").train()
    runner = load_model(model)
    assert runner.model is model and not model.training
    assert isinstance(Gemma3Runner.from_hf(build_model("gemma3-tiny")), Gemma3Runner)


def test_load_directory_round_trip(tmp_path):
    model = build_model("gemma2-tiny", seed=11)
    model.save_pretrained(tmp_path)
    runner = load_model(tmp_path)
    assert runner.model_type == "gemma2" and runner.model is not model
    tokens = random_tokens(20)
    logits = PagedCache(runner).step({"a": tokens})["a"]
    torch.testing.assert_close(logits, hf_logits(model, tokens), rtol=0, atol=1e-4)


def test_missing_directory(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(str(missing))


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)


def test_unreadable_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        load_model(tmp_path)


def test_unsupported_model_type_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="unsupported model_type 'bert'.*gemma3_text"):
        load_model(tmp_path)


def test_unsupported_model_instance():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
        load_model(LlamaForCausalLM(config))


def test_register_runner(monkeypatch):
    monkeypatch.setattr(registry_module, "RUNNERS", dict(registry_module.RUNNERS))

    class LlamaRunner(ModelRunner):
        model_type = "llama"

    register_runner("llama", LlamaRunner)
    assert get_runner_class("llama") is LlamaRunner
    assert "llama" in supported_model_types()
    with pytest.raises(ValueError, match="not a ModelRunner"):
        register_runner("llama", object)


def test_runner_input_checks():
    runner = load_model("mistral-tiny")
    ids = torch.tensor([5, 6, 7])
    with pytest.raises(ValueError, match="bind_kv_cache"):
        runner.forward(ids, torch.arange(3), {}, torch.tensor([2]))
    with pytest.raises(ValueError, match="no cache for layer"):
        runner.bind_kv_cache({})
    bad = {name: (torch.zeros(4, 4, 3, 16), torch.zeros(4, 4, 3, 16))
           for name in runner.kv_cache_specs(4)}
    with pytest.raises(ValueError, match="expected"):
        runner.bind_kv_cache(bad)
    PagedCache(runner)
    with pytest.raises(ValueError, match="1-D"):
        runner.forward(ids, torch.arange(4), {}, torch.tensor([2]))
    with pytest.raises(ValueError, match="attn_batches"):
        runner.forward(ids, torch.arange(3), {}, torch.tensor([2]))
