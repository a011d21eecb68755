"""Logprobs of sampled and prompt tokens equal log_softmax of the Hugging Face
model's own logits (teacher-forced over the same tokens), with the top-k in
descending order and the rank counted by brute force. They are the RAW
model distribution: penalties, bias and temperature do not change them.
"""

import pytest
import torch
from engine_helpers import smallest_pool

from hybridkv import LLM, SamplingParams
from hybridkv.engine import TokenLogprobs
from hybridkv.models.presets import build_preset_model

ATOL = 1e-4
PROMPT = [5, 9, 14, 3, 77, 120, 9, 14, 3, 250, 251, 17, 19, 23, 99, 100, 101, 3, 4, 5, 6]


@pytest.fixture(scope="module", params=["gemma3-tiny", "jamba-tiny"])
def model(request):
    return build_preset_model(request.param, seed=0)


def hf_logprobs(model, tokens):
    """log_softmax of HF's logits at every position of `tokens`: [len, vocab]."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens]), use_cache=False).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def check_entry(entry, reference, token, k):
    """`entry` against one row of reference logprobs [vocab]."""
    assert isinstance(entry, TokenLogprobs) and entry.token_id == token
    assert entry.logprob == pytest.approx(float(reference[token]), abs=ATOL)
    above = int((reference > reference[token] + ATOL).sum())
    within = int((reference >= reference[token] - ATOL).sum())
    assert above + 1 <= entry.rank <= within
    assert len(entry.top) == k
    ids = [t for t, _ in entry.top]
    values = [v for _, v in entry.top]
    assert values == sorted(values, reverse=True)
    assert values == pytest.approx(reference[ids].tolist(), abs=ATOL)
    kth = torch.topk(reference, k).values[-1] if k else None
    if kth is not None:  # nothing outside the list is more likely than its last entry
        outside = torch.ones_like(reference, dtype=torch.bool)
        outside[ids] = False
        assert float(reference[outside].max()) <= float(kth) + ATOL


@pytest.mark.parametrize("extras", [
    dict(), dict(temperature=1.3, seed=7), dict(repetition_penalty=1.7, logit_bias={40: 3.0}),
], ids=["greedy", "sampled", "penalized"])
def test_sampled_logprobs_are_the_raw_model_distribution(model, extras):
    llm = LLM(model, block_size=4, num_blocks=64, max_num_batched_tokens=8)
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=5, **extras)
    out = llm.generate([PROMPT], params)[0]
    assert len(out.logprobs) == len(out.output_token_ids) == 6
    reference = hf_logprobs(model, PROMPT + out.output_token_ids)
    for j, (entry, token) in enumerate(zip(out.logprobs, out.output_token_ids)):
        check_entry(entry, reference[len(PROMPT) - 1 + j], token, 5)
    if not extras:
        assert all(entry.rank == 1 for entry in out.logprobs)  # greedy takes the argmax


def test_logprobs_zero_gives_the_sampled_token_only_and_none_means_none(model):
    llm = LLM(model, block_size=4, num_blocks=64)
    zero, none = llm.generate([PROMPT, PROMPT], [
        SamplingParams(max_tokens=3, ignore_eos=True, logprobs=0),
        SamplingParams(max_tokens=3, ignore_eos=True)])
    assert [e.top for e in zero.logprobs] == [(), (), ()]
    assert [e.token_id for e in zero.logprobs] == zero.output_token_ids
    assert none.logprobs is None and none.prompt_logprobs is None
    assert zero.output_token_ids == none.output_token_ids


def test_prompt_logprobs_equal_teacher_forced_hf_across_chunks(model):
    llm = LLM(model, block_size=4, num_blocks=64, max_num_batched_tokens=8)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=2, ignore_eos=True,
                                                prompt_logprobs=3))[0]
    assert len(out.prompt_logprobs) == len(PROMPT) and out.prompt_logprobs[0] is None
    reference = hf_logprobs(model, PROMPT)
    for i in range(1, len(PROMPT)):
        check_entry(out.prompt_logprobs[i], reference[i - 1], PROMPT[i], 3)


def test_prompt_logprobs_bypass_a_prefix_cache_hit():
    model = build_preset_model("gemma3-tiny", seed=0)
    llm = LLM(model, block_size=4, num_blocks=64, max_num_batched_tokens=8)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    llm.generate([PROMPT], params)
    plain = llm.generate([PROMPT], params)[0]
    out = llm.generate([PROMPT], SamplingParams(max_tokens=2, ignore_eos=True,
                                                prompt_logprobs=1))[0]
    assert plain.num_cached_tokens > 0, "the prompt must be cached for the bypass to show"
    assert out.num_cached_tokens == 0  # a prompt-logprobs request computes its whole prompt
    assert out.output_token_ids == plain.output_token_ids
    reference = hf_logprobs(model, PROMPT)
    for i in range(1, len(PROMPT)):
        check_entry(out.prompt_logprobs[i], reference[i - 1], PROMPT[i], 1)
    again = llm.generate([PROMPT], params)[0]
    assert again.num_cached_tokens > 0  # what it computed is cached for the others


def test_prompt_logprobs_of_a_one_token_prompt_and_of_a_batch(model):
    llm = LLM(model, block_size=4, num_blocks=64, max_num_batched_tokens=8)
    params = SamplingParams(max_tokens=2, ignore_eos=True, prompt_logprobs=0, logprobs=1)
    one, short, longer = llm.generate([[7], PROMPT[:5], PROMPT], params)
    assert one.prompt_logprobs == [None]
    for out, prompt in ((short, PROMPT[:5]), (longer, PROMPT)):
        reference = hf_logprobs(model, prompt + out.output_token_ids)
        assert len(out.prompt_logprobs) == len(prompt)
        for i in range(1, len(prompt)):
            check_entry(out.prompt_logprobs[i], reference[i - 1], prompt[i], 0)
        check_entry(out.logprobs[0], reference[len(prompt) - 1], out.output_token_ids[0], 1)


def test_prompt_logprobs_survive_preemption_mid_prompt():
    model = build_preset_model("gemma3-tiny", seed=0)
    num_blocks = smallest_pool(model, 33, 8, block_size=4).config.num_blocks + 4
    llm = LLM(model, block_size=4, num_blocks=num_blocks, max_num_batched_tokens=8)
    params = SamplingParams(max_tokens=12, ignore_eos=True, prompt_logprobs=2)
    prompts = [PROMPT, PROMPT[::-1]]
    seqs = [llm.add_request(p, params) for p in prompts]
    partly_filled_when_preempted = False
    while llm.has_unfinished_requests():
        llm.step()
        for seq in seqs:
            if seq in llm.scheduler.waiting and seq.num_preemptions:
                partly_filled_when_preempted |= 1 < len(seq.prompt_logprobs) < len(PROMPT)
    assert partly_filled_when_preempted
    for prompt, seq in zip(prompts, seqs):
        reference = hf_logprobs(model, prompt)
        assert len(seq.prompt_logprobs) == len(prompt)
        for i in range(1, len(prompt)):
            check_entry(seq.prompt_logprobs[i], reference[i - 1], prompt[i], 2)
    assert llm.kv.usage == 0
