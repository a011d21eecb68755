"""LLM.generate is token-exact with the Hugging Face model's own greedy decoding.

For every attention family, with prefix caching on and off, on prompts that
share prefixes longer than the window / chunk, so that hits really happen in
every group. The reference is `model.generate(do_sample=False)` on each
prompt alone.
"""

import pytest
import torch
from engine_helpers import smallest_pool

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import build_preset_model

# pools barely larger than one request on purpose: the repeated-miss warning is expected
pytestmark = pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")

PRESETS = ["gemma3-tiny", "gemma2-tiny", "qwen2-tiny", "mistral-tiny", "llama4-tiny",
           "gpt-oss-tiny"]
MAX_TOKENS = 6


def shared_prefix_prompts(seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 512, (120,), generator=g).tolist()
    # 104 shared tokens: past the 32-token windows / chunks of the presets
    return [base[:104] + [5, 6, 7], base[:104] + [9], base[:61], base, base[:104] + [5, 6, 7]]


def hf_greedy(model, prompt, n=MAX_TOKENS):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=PRESETS)
def preset(request):
    model = build_preset_model(request.param, seed=0)
    prompts = shared_prefix_prompts()
    return request.param, model, prompts, [hf_greedy(model, p) for p in prompts]


@pytest.mark.parametrize("caching", [True, False])
def test_greedy_output_equals_hugging_face(preset, caching):
    name, model, prompts, expected = preset
    llm = LLM(model, enable_prefix_caching=caching, block_size=8, num_blocks=160)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert [o.output_token_ids for o in outs] == expected, name
    cached = [o.num_cached_tokens for o in outs]
    if caching:
        assert cached[1] >= 96 and cached[3] >= 96 and cached[4] >= 104, cached
    else:
        assert cached == [0] * len(prompts)
    # a second call hits blocks cached by the first and still agrees
    again = llm.generate(prompts[:2], params)
    assert [o.output_token_ids for o in again] == expected[:2]
    if caching:
        assert all(o.num_cached_tokens >= 96 for o in again)


def test_batch_equals_one_at_a_time_and_preemption_changes_nothing(preset):
    name, model, prompts, expected = preset
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    one_by_one = []
    for p in prompts:
        llm = LLM(model, block_size=8, num_blocks=160)
        one_by_one.append(llm.generate([p], params)[0].output_token_ids)
    assert one_by_one == expected
    tiny = smallest_pool(model, max(map(len, prompts)) + MAX_TOKENS, chunk=32)
    outs = tiny.generate(prompts, params)
    assert [o.output_token_ids for o in outs] == expected, name
    assert tiny.stats.preemptions > 0
    assert tiny.kv.num_free_blocks == tiny.config.num_blocks - 1
