"""Prompts given as 1-D integer numpy arrays or torch tensors are token-id lists."""

import numpy as np
import pytest
import torch

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import build_preset_model

PROMPT = [5, 17, 3, 99, 250, 7, 42, 8, 300, 11]
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(build_preset_model("qwen2-tiny", seed=0), block_size=8, num_blocks=64)


@pytest.fixture(scope="module")
def expected(llm):
    return llm.generate([PROMPT], PARAMS)[0].output_token_ids


@pytest.mark.parametrize("make", [
    lambda p: np.array(p),
    lambda p: np.array(p, dtype=np.int32),
    lambda p: np.array(p, dtype=np.uint16),
    lambda p: torch.tensor(p),
    lambda p: torch.tensor(p, dtype=torch.int32),
    lambda p: torch.tensor([0] + p)[1:],  # a view with an offset
    lambda p: {"prompt_token_ids": np.array(p), "cache_salt": "t"},
])
def test_array_prompts_generate_like_lists(llm, expected, make):
    outs = llm.generate([make(PROMPT), PROMPT], PARAMS)
    assert [o.output_token_ids for o in outs] == [expected, expected]
    assert outs[0].prompt_token_ids == PROMPT and type(outs[0].prompt_token_ids[0]) is int


@pytest.mark.parametrize("prompt, match", [
    (np.array([PROMPT, PROMPT]), r"1-D integer token ids, got shape \(2, 10\)"),
    (torch.tensor([PROMPT]), r"shape \(1, 10\)"),
    (np.array(PROMPT, dtype=np.float32), "dtype float32"),
    (torch.tensor(PROMPT, dtype=torch.float64), "dtype torch.float64"),
    (torch.tensor(PROMPT) > 50, "dtype torch.bool"),
    (np.array(PROMPT) > 50, "dtype bool"),
    (np.array(7), r"shape \(\)"),
    (np.array([], dtype=np.int64), "empty"),
    (np.array([1, 2, 512]), "token id 512 is outside the vocabulary"),
    (torch.tensor([1, -3]), "token id -3 is outside the vocabulary"),
])
def test_bad_array_prompts_are_refused_before_anything_runs(llm, prompt, match):
    before = (llm.kv.num_free_blocks, llm.stats.steps, llm.kv.prefix_cache_stats.queries)
    with pytest.raises(ValueError, match=rf"prompt 1\b.*{match}"):
        llm.generate([PROMPT, prompt], PARAMS)
    assert (llm.kv.num_free_blocks, llm.stats.steps,
            llm.kv.prefix_cache_stats.queries) == before
