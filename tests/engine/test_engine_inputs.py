"""The engine's bad inputs raise clear errors before any state changes; sampling is seeded."""

import json
import time

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import build_preset_model


@pytest.fixture(scope="module")
def llm():
    return LLM(build_preset_model("qwen2-tiny", seed=0), block_size=8, num_blocks=64)


def engine_state(llm):
    return (llm.kv.num_free_blocks, llm.stats.steps, len(llm.scheduler.waiting),
            len(llm.scheduler.running), llm.kv.prefix_cache_stats.queries)


@pytest.mark.parametrize("prompts, match", [
    ([[]], "empty"),
    ([], "non-empty"),
    ("hello", "non-empty"),
    ([[1, 2, 512]], "outside the vocabulary"),
    ([[1, -1]], "outside the vocabulary"),
    ([[1, 2.0]], "outside the vocabulary"),
    ([[1] * 600], "context"),
    ([[1, 2], "text"], "no tokenizer"),
])
def test_bad_prompts_are_rejected_before_anything_runs(llm, prompts, match):
    before = engine_state(llm)
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts, SamplingParams(max_tokens=2))
    assert engine_state(llm) == before


def test_a_prompt_that_can_never_fit_the_pool_is_rejected():
    small = LLM(build_preset_model("qwen2-tiny", seed=0), block_size=8, num_blocks=8)
    with pytest.raises(ValueError, match="more KV cache blocks than the whole pool"):
        small.generate([[1] * 200], SamplingParams(max_tokens=2))


@pytest.mark.parametrize("kwargs, match", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"seed": "x"}, "seed"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_per_prompt_must_match(llm):
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate([[1, 2], [3, 4]], [SamplingParams()])


def test_missing_and_unsupported_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        LLM(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="bert"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        LLM(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither a preset"):
        LLM("no-such-preset")


@pytest.mark.parametrize("kwargs, match", [
    ({"block_size": 0}, "block_size"),
    ({"num_blocks": 1}, "num_blocks"),
    ({"kv_cache_memory_bytes": 100}, "kv_cache_memory_bytes"),
    ({"hash_algo": "md5"}, "hash_algo"),
    ({"eviction_policy": "mru"}, "eviction_policy"),
])
def test_bad_engine_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM("qwen2-tiny", **kwargs)


def test_seeded_sampling_is_reproducible_and_caching_does_not_change_it():
    model = build_preset_model("gemma3-tiny", seed=0)
    params = SamplingParams(max_tokens=8, temperature=0.8, seed=123, ignore_eos=True)
    prompt = list(range(1, 60))
    runs = []
    for caching in (True, False, True):
        llm = LLM(model, enable_prefix_caching=caching, block_size=8, num_blocks=64)
        runs.append(llm.generate([prompt, prompt], params))
    tokens = [[o.output_token_ids for o in run] for run in runs]
    assert tokens[0] == tokens[1] == tokens[2]
    assert tokens[0][0] == tokens[0][1]  # same seed, same prompt


def test_stop_on_eos_and_max_tokens():
    model = build_preset_model("qwen2-tiny", seed=0)
    llm = LLM(model, block_size=8, num_blocks=64)
    out = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert len(out.output_token_ids) == 5 and out.finish_reason == "length"
    first = out.output_token_ids[0]
    llm.runner.eos_token_ids = (first,)  # make the first greedy token the EOS
    out = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=5))[0]
    assert out.output_token_ids == [first] and out.finish_reason == "stop"


def test_request_metrics_follow_the_steps(llm):
    """Arrival is the generate() call, the first token comes from the step that
    finished the prompt, and the finish from the step that sampled the last token:
    a 1-token request in the same batch finishes no later than a 6-token one, and
    all of it lies inside the wall time of the call."""
    before = time.perf_counter()
    short, long = llm.generate([[3, 4, 5, 6], [7, 8, 9, 10]],
                               [SamplingParams(max_tokens=1, ignore_eos=True),
                                SamplingParams(max_tokens=6, ignore_eos=True)])
    after = time.perf_counter()
    for out in (short, long):
        m = out.metrics
        assert before <= m.arrival_time <= m.first_token_time <= m.finished_time <= after
        assert m.time_to_first_token == m.first_token_time - m.arrival_time
    assert short.metrics.arrival_time == long.metrics.arrival_time
    assert short.metrics.first_token_time == long.metrics.first_token_time  # same step
    assert short.metrics.finished_time < long.metrics.finished_time
    assert long.metrics.finished_time > long.metrics.first_token_time  # five more steps
