"""The engine with a request that recomputes data a cached full-attention block
holds (a prompt of whole blocks hits all but its last block): the request takes
that block, rewrites the same values into it while another request reads it,
and both stay token-exact with the Hugging Face model.
"""

import pytest
import torch

from hybridkv import LLM, FullAttentionSpec, SamplingParams
from hybridkv.models.presets import build_preset_model

MAX_TOKENS = 6


@pytest.mark.parametrize("preset", ["gemma3-tiny", "qwen2-tiny"])
def test_a_taken_block_is_rewritten_with_the_same_values(preset):
    model = build_preset_model(preset, seed=0)
    prompt = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(3)).tolist()
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS,
                              min_new_tokens=MAX_TOKENS, do_sample=False)[0, 64:].tolist()
    llm = LLM(model, block_size=8, num_blocks=200, poison_kv_cache=True)
    full = next(g for g, group in enumerate(llm.config.kv_cache_groups)
                if type(group.kv_cache_spec) is FullAttentionSpec)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    first = llm.add_request(prompt, params, request_id="first")
    llm.step()  # the first prompt is computed; it keeps decoding (reading its blocks)
    second = llm.add_request(prompt, params, request_id="second")
    llm.step()  # hit: 7 blocks; block 7 is recomputed into the first request's block
    ids_first = llm.kv.get_block_ids("first")[full]
    ids_second = llm.kv.get_block_ids("second")[full]
    assert ids_second[:8] == ids_first[:8]
    while llm.has_unfinished_requests():
        llm.step()
    assert second.request.output_token_ids == expected
    assert first.request.output_token_ids == expected
    assert llm.kv.num_free_blocks == llm.config.num_blocks - 1
