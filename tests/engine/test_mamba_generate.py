"""Mamba hybrids end to end: greedy output equals Hugging Face's no-cache greedy decoding.

The reference re-runs the Hugging Face model over the whole sequence with no
cache for every token (never its cached continuation). States decay slowly
(A_log set near A = 0), so a dropped or wrong initial state changes tokens.
Prompts share prefixes shorter than a block, exactly on a block boundary,
mid-block, and over a thousand tokens; repeats must hit.
"""

import math

import pytest
import torch

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import build_preset_model
from hybridkv.testing.models import hf_greedy_no_cache, slow_decay

# pools barely larger than one request on purpose: the repeated-miss warning is expected
pytestmark = pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")

MAX_TOKENS = 5
BLOCK = 8


def hit_alignment(model):
    """Hits are multiples of the lcm of the groups' block sizes (attention blocks are
    scaled up so their pages match the Mamba state's)."""
    config = LLM(model, block_size=BLOCK, num_blocks=8).config
    return math.lcm(*(g.kv_cache_spec.block_size for g in config.kv_cache_groups))


def prompts_with_shared_prefixes(align):
    g = torch.Generator().manual_seed(3)
    base = torch.randint(3, 512, (1100,), generator=g).tolist()
    tail = torch.randint(3, 512, (40,), generator=g).tolist()
    return [
        base[:1030],                            # long document
        base[:1030] + tail[:7],                 # shares 1,030 tokens (mid-block)
        base[:5] + tail[:9],                    # shares less than a block
        base[:2 * align] + tail[:3],            # shares exactly two blocks
        base[:2 * align + 3] + tail[3:12],      # shares two blocks and 3 tokens: mid-block
        base[:1030] + tail[:7],                 # an exact repeat
    ]


@pytest.fixture(scope="module", params=["jamba-tiny", "nemotron-h-tiny"])
def hybrid(request):
    model = build_preset_model(request.param, seed=0)
    slow_decay(model)
    align = hit_alignment(model)
    prompts = prompts_with_shared_prefixes(align)
    expected = [hf_greedy_no_cache(model, p, MAX_TOKENS) for p in prompts]
    return request.param, model, prompts, expected, align


@pytest.mark.parametrize("caching", [True, False])
def test_greedy_equals_hugging_face_no_cache(hybrid, caching):
    name, model, prompts, expected, align = hybrid
    llm = LLM(model, enable_prefix_caching=caching, block_size=BLOCK, num_blocks=800,
              poison_kv_cache=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    first = llm.generate(prompts[:1], params)  # cache the document first
    rest = llm.generate(prompts[1:], params)
    outs = first + rest
    assert [o.output_token_ids for o in outs] == expected, name
    cached = [o.num_cached_tokens for o in outs]
    if caching:
        assert cached[1] == 1030 // align * align, cached  # floor to the block boundary
        assert cached[5] == 1036 // align * align, cached  # the repeat also hits prompt 1's tail
        assert cached[3] == 2 * align and cached[4] == 2 * align, cached  # mid-block falls back
        assert cached[2] == 0, cached
    else:
        assert cached == [0] * len(prompts)
    assert llm.kv.num_free_blocks == llm.config.num_blocks - 1


def test_mixed_batch_and_preemption_match_one_at_a_time(hybrid):
    name, model, prompts, expected, _ = hybrid
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    batch, want = prompts[2:5] * 2, expected[2:5] * 2
    ample = LLM(model, block_size=BLOCK, num_blocks=800, poison_kv_cache=True)
    assert [o.output_token_ids for o in ample.generate(batch, params)] == want
    preempted = False
    for num_blocks in range(6, 40, 2):  # shrinking pools until requests get preempted
        llm = LLM(model, block_size=BLOCK, num_blocks=num_blocks, max_num_batched_tokens=8,
                  poison_kv_cache=True)
        if not llm.kv.can_fit(max(map(len, batch)) + MAX_TOKENS, 8):
            continue
        outs = llm.generate(batch, params)
        assert [o.output_token_ids for o in outs] == want, (name, num_blocks)
        assert llm.kv.num_free_blocks == llm.config.num_blocks - 1
        preempted = preempted or llm.stats.preemptions > 0
        if preempted:
            break
    assert preempted, name
