"""Decode-sized steps run on `small_step_threads` CPU threads; torch's setting is restored."""

import torch

from hybridkv import LLM, SamplingParams
from hybridkv.engine.executor import (
    SMALL_STEP_TOKENS,
    STREAMED_WEIGHT_BYTES,
    small_step_thread_count,
)


def record_threads(llm: LLM) -> list[tuple[int, int]]:
    """(new tokens, torch threads) of every forward from now on."""
    seen = []
    forward = llm.runner.forward

    def spy(input_ids, *args, **kwargs):
        seen.append((input_ids.shape[0], torch.get_num_threads()))
        return forward(input_ids, *args, **kwargs)

    llm.runner.forward = spy
    return seen


def test_small_steps_use_one_thread_and_restore_the_setting():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        llm = LLM("gemma3-tiny", max_num_batched_tokens=256)
        seen = record_threads(llm)
        prompt = list(range(3, 3 + SMALL_STEP_TOKENS + 40))
        llm.generate([prompt, list(range(200, 220))], SamplingParams(max_tokens=4, ignore_eos=True))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
    assert seen[0] == (SMALL_STEP_TOKENS + 40 + 20, 2)  # the prefill step: torch's setting
    assert all(threads == 1 for tokens, threads in seen[1:]) and len(seen) == 4


def test_none_keeps_torchs_setting():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        llm = LLM("gemma3-tiny")
        llm.executor.small_step_threads = None
        seen = record_threads(llm)
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
    finally:
        torch.set_num_threads(previous)
    assert [threads for _, threads in seen] == [2, 2, 2]


def test_auto_counts_threads_by_the_bytes_of_the_weights():
    big = torch.nn.Linear(4096, STREAMED_WEIGHT_BYTES // (4096 * 4), bias=False)
    assert big.weight.numel() * 4 == STREAMED_WEIGHT_BYTES
    assert small_step_thread_count(big) is None  # streamed from memory: torch's setting
    assert small_step_thread_count(torch.nn.Linear(4096, 8, bias=False)) == 1
    assert small_step_thread_count(big.to(torch.bfloat16)) == 1  # half the bytes
    llm = LLM("gemma3-tiny")
    assert llm.executor.small_step_threads == 1  # the presets are small
