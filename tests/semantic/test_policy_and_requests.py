"""The learned-threshold rule keeps served errors under the bound on a
synthetic world with a known error curve; which requests are reusable and
under which scope; hit bodies read back as the model's bodies are."""

import random

import pytest

from hybridkv.semantic.responses import Answer, hit_body, hit_events, read_answer, usage
from hybridkv.semantic.reuse import request_key
from hybridkv.semantic.thresholds import ThresholdPolicy


def p_wrong(s):
    """The synthetic world: wrong answers get rarer as similarity grows."""
    return max(0.0, min(1.0, (0.97 - s) / 0.1))


@pytest.mark.parametrize("bound", [0.01, 0.05])
def test_served_errors_stay_under_the_bound(bound):
    world, policy = random.Random(1), ThresholdPolicy(0.9, error_bound=bound, floor=0.8, seed=2)
    served = wrong_served = 0
    for i in range(20000):
        s = world.uniform(0.8, 1.0)
        wrong = world.random() < p_wrong(s)
        action = policy.decide(i, s)
        if action == "serve":
            served += 1
            wrong_served += wrong
        elif action == "verify":
            policy.record(i, s, wrong)
    assert served > 1000  # it learned to serve the safe region
    assert wrong_served / served <= bound


def test_a_wrong_verification_raises_that_entry_only():
    policy = ThresholdPolicy(0.9, error_bound=0.01, floor=0.8, seed=0)
    policy.record(7, 0.93, True)
    assert policy.entry_threshold(7) > 0.93
    assert policy.decide(7, 0.93) == "miss"
    assert policy.entry_threshold(8) == 0.8


def test_fixed_threshold_serves_at_and_above_it():
    policy = ThresholdPolicy(0.9)
    assert [policy.decide(1, s) for s in (0.89, 0.9, 0.99)] == ["miss", "serve", "serve"]


def chat(text, **fields):
    return {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": text}], "temperature": 0, **fields}


@pytest.mark.parametrize("fields", [{"n": 2}, {"logprobs": True}, {"top_logprobs": 2},
                                    {"tools": [{"type": "function"}]}, {"temperature": 0.7},
                                    {"semantic_cache": False}, {"return_token_ids": True}])
def test_unreusable_requests_are_not_looked_up(fields):
    assert request_key(chat("hi there", **fields), True, "m", None) is None


def test_scope_separates_tenants_models_parameters_and_history():
    base = request_key(chat("hi there"), True, "m", "Bearer a")
    assert base is not None and base[1] == "hi there"
    assert request_key(chat("other words"), True, "m", "Bearer a")[0] == base[0]
    assert request_key(chat("hi there", stream=True), True, "m", "Bearer a")[0] == base[0]
    seeded = chat("hi there", temperature=0.8, seed=3)
    for other in (request_key(chat("hi there"), True, "m", "Bearer b"),
                  request_key(chat("hi there"), True, "m2", "Bearer a"),
                  request_key(chat("hi there", cache_salt="x"), True, "m", "Bearer a"),
                  request_key(chat("hi there", max_tokens=5), True, "m", "Bearer a"),
                  request_key(seeded, True, "m", "Bearer a"),
                  request_key({**chat("hi there"), "messages": [
                      {"role": "user", "content": "hi there"}]}, True, "m", "Bearer a")):
        assert other is not None and other[0] != base[0]
    assert request_key({"prompt": [1, 2, 3], "temperature": 0}, False, "m", None) is None


@pytest.mark.parametrize("chat_mode", [True, False])
@pytest.mark.parametrize("stream", [True, False])
def test_hit_bodies_read_back_whole(chat_mode, stream):
    answer = Answer("Paris is the capital of France, on the Seine.", "length", 11)
    use = usage(7, 11)
    if stream:
        raw = "".join(hit_events(chat_mode, "m", answer, use)).encode()
    else:
        import json
        raw = json.dumps(hit_body(chat_mode, "m", answer, use)).encode()
    assert read_answer(raw, chat_mode, stream) == answer


def test_cut_or_failed_streams_are_not_stored():
    events = list(hit_events(True, "m", Answer("some text", "stop", None), None))
    assert read_answer("".join(events[:-1]).encode(), True, True) is None  # no [DONE]
    error = 'data: {"error": {"message": "engine died"}}\n\n'
    assert read_answer((events[0] + error).encode(), True, True) is None
