"""The scheduler's per-step traces keep only the last steps, so a server that runs
for days does not grow with them, while a short run still sees every step."""

from hybridkv import LLM, SamplingParams
from hybridkv.engine import scheduler


def test_step_traces_keep_the_last_steps_only(monkeypatch):
    monkeypatch.setattr(scheduler, "TRACE_STEPS", 4)
    llm = LLM("gemma3-tiny", num_blocks=64)
    llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=10, ignore_eos=True))
    stats = llm.scheduler.stats
    assert stats.steps == 10  # one prefill step (it samples the first token), nine decodes
    assert len(stats.usage_trace) == len(stats.tokens_trace) == 4
    # the kept entries are the last four steps: one running request with 10..13 tokens
    assert list(stats.tokens_trace) == [10, 11, 12, 13]


def test_a_short_run_keeps_every_step():
    llm = LLM("gemma3-tiny", num_blocks=64)
    llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert list(llm.scheduler.stats.tokens_trace) == [4, 5, 6]
