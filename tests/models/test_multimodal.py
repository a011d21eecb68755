"""Multimodal checkpoints (Gemma 3 4B+, Llama 4 Scout/Maverick) served text-only.

The models are tiny random-weight `Gemma3ForConditionalGeneration` and
`Llama4ForConditionalGeneration`, built with their `transformers` classes
(small text and vision configs) and saved with `save_pretrained`. The
reference is the multimodal model's own greedy `generate` on text-only ids.
"""

import json

import pytest
import torch
from paged_harness import PagedCache, assert_logits_close, hf_logits
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Llama4Config,
    Llama4ForConditionalGeneration,
)

from hybridkv import LLM, SamplingParams
from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)
from hybridkv.models import get_runner_class, load_model, supported_model_types
from hybridkv.models.layouts import layout_from_hf_config, model_layout
from hybridkv.tools.cli import main

MAX_TOKENS = 6
TEXT = {"vocab_size": 512, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
        "initializer_range": 0.1, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 2, "image_size": 32, "patch_size": 8}


def tiny_gemma3(final_logit_softcapping=None):
    text = {**TEXT, "num_hidden_layers": 4, "intermediate_size": 128, "sliding_window": 32,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "query_pre_attn_scalar": 32, "final_logit_softcapping": final_logit_softcapping,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0,
                                   "factor": 8.0}}}
    config = Gemma3Config(text_config=text, vision_config=VISION, mm_tokens_per_image=4,
                          image_token_index=511)
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration(config).eval()


def tiny_llama4():
    text = {**TEXT, "num_hidden_layers": 4, "intermediate_size": 64,
            "intermediate_size_mlp": 128, "attention_chunk_size": 32,
            "no_rope_layer_interval": 4, "interleave_moe_layer_step": 2,
            "num_local_experts": 4, "num_experts_per_tok": 1, "use_qk_norm": True,
            "attn_temperature_tuning": True, "floor_scale": 16, "attn_scale": 0.1}
    vision = {**VISION, "vision_output_dim": 32, "projector_input_dim": 32,
              "projector_output_dim": 32}
    config = Llama4Config(text_config=text, vision_config=vision, image_token_index=511)
    torch.manual_seed(0)
    return Llama4ForConditionalGeneration(config).eval()


def prompts():
    g = torch.Generator().manual_seed(3)
    base = torch.randint(3, 500, (100,), generator=g).tolist()
    # 80 shared tokens: past the 32-token windows / chunks, so hits cross them
    return [base[:80] + [5, 6, 7], base[:80] + [9], base[:41], base]


def hf_greedy(model, prompt):
    """Hugging Face's greedy decoding of text-only ids.

    Gemma 3: the multimodal model's `generate`. Llama 4: `generate` of its
    `language_model` (the Llama4ForCausalLM whose logits the multimodal forward
    returns, fed the same embeddings), because the multimodal forward fails in
    transformers 5.24: its output wrapper reads `image_outputs` from the text
    model's output, which has none.
    """
    generator = model if model.config.model_type == "gemma3" else model.language_model
    out = generator.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS,
                             min_new_tokens=MAX_TOKENS, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=["gemma3", "llama4"])
def checkpoint(request, tmp_path_factory):
    model = tiny_gemma3() if request.param == "gemma3" else tiny_llama4()
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return model, path, [hf_greedy(model, p) for p in prompts()]


@pytest.mark.parametrize("source", ["directory", "instance"])
def test_text_generation_equals_the_multimodal_model(checkpoint, source):
    model, path, expected = checkpoint
    llm = LLM(str(path) if source == "directory" else model, block_size=8, num_blocks=160)
    outs = llm.generate(prompts(), SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.output_token_ids for o in outs] == expected
    assert outs[1].num_cached_tokens >= 72 and outs[3].num_cached_tokens >= 72


def test_runner_uses_the_text_config_and_shares_the_weights(checkpoint):
    model, _, _ = checkpoint
    runner = load_model(model)
    text_type = model.config.text_config.model_type
    assert runner.model_type == text_type and isinstance(runner, get_runner_class(text_type))
    assert runner.vocab_size == 512 and runner.max_model_len == 512
    assert runner.model.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr() \
        if hasattr(model, "lm_head") else \
        runner.model.lm_head.weight.data_ptr() == model.language_model.lm_head.weight.data_ptr()
    assert not any(p.is_meta for p in runner.model.parameters())
    kinds = {type(s) for s in runner.kv_cache_specs(16).values()}
    assert kinds == ({SlidingWindowSpec, FullAttentionSpec} if text_type == "gemma3_text"
                     else {ChunkedLocalAttentionSpec, FullAttentionSpec})


def test_gemma3_multimodal_logits_are_not_softcapped():
    # Gemma3ForConditionalGeneration ignores text_config.final_logit_softcapping (which
    # Gemma3ForCausalLM applies); greedy tokens cannot show it, the logits do
    model = tiny_gemma3(final_logit_softcapping=0.5)
    tokens = prompts()[3]
    ours = PagedCache(load_model(model)).step({"a": tokens})["a"]
    reference = hf_logits(model, tokens)
    assert reference.abs().max() > 1.0  # what a cap of 0.5 would have squashed
    assert_logits_close(ours, reference)
    assert model.config.text_config.final_logit_softcapping == 0.5  # the model is untouched


def test_multimodal_types_are_supported():
    assert {"gemma3", "llama4"} <= set(supported_model_types())


@pytest.mark.parametrize("config, kinds", [
    (Gemma3Config(), {SlidingWindowSpec, FullAttentionSpec}),
    (Llama4Config(), {ChunkedLocalAttentionSpec, FullAttentionSpec}),
])
def test_layouts_of_default_multimodal_configs(config, kinds, tmp_path):
    text = config.get_text_config()
    from_config = layout_from_hf_config(config, 16)
    assert len(from_config) == text.num_hidden_layers
    assert {type(s) for s in from_config.values()} == kinds
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == config.model_type
    for where in (tmp_path, tmp_path / "config.json"):
        assert model_layout(str(where), 16) == from_config


def test_simulate_takes_a_multimodal_config(tmp_path, capsys):
    Llama4Config().save_pretrained(tmp_path / "scout")
    code = main(["simulate", "--model", str(tmp_path / "scout"), "--memory", "8GiB",
                 "--trace", "few-shot", "--sweep", "1", "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    assert "hit rate" in capsys.readouterr().out
