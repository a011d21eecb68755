"""The full-attention checkpoint the router benchmark serves: Hugging Face reads it
as full attention on every layer, hybridkv lays it out as full-attention groups
only, and hybridkv's greedy output on it equals the Hugging Face model's."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hybridkv import LLM, SamplingParams
from hybridkv.kv_cache.specs import FullAttentionSpec
from hybridkv.models.layouts import layout_from_config_file
from hybridkv.models.tokenizers import load_preset_tokenizer
from hybridkv.tools.tokenizer_checkpoint import save_full_attention_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_full_attention_checkpoint(tmp_path_factory.mktemp("full-attention"))


def test_every_layer_is_full_attention(checkpoint):
    config = AutoConfig.from_pretrained(checkpoint)
    assert not config.use_sliding_window
    assert config.layer_types == ["full_attention"] * config.num_hidden_layers
    specs = layout_from_config_file(checkpoint / "config.json", 16)
    assert len(specs) == config.num_hidden_layers
    assert all(type(spec) is FullAttentionSpec for spec in specs.values())


def test_tokenizer_is_the_qwen2_presets(checkpoint):
    text = "Full attention keeps every key."
    assert AutoTokenizer.from_pretrained(checkpoint).encode(text) == \
        load_preset_tokenizer("qwen2-tiny").encode(text)


def test_greedy_output_equals_hugging_faces(checkpoint):
    prompt = list(range(3, 60))  # past the preset's old window of 32
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                                  pad_token_id=0)[0, len(prompt):].tolist()
    llm = LLM(str(checkpoint), num_blocks=64)
    out = llm.generate([prompt], SamplingParams(max_tokens=6))[0]
    assert out.output_token_ids == expected
