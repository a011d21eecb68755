"""One request's failure ends that request alone.

Three greedy requests run through `add_request` / `step`; a fault is
injected (monkeypatching the exact function) at one point of the handling of
request "v" only: its KV store lookup, its logits extras, the sampler, its
logprobs, its prompt logprobs, the stop-string search, the tokenizer that
decodes for it. "v" must end with finish_reason "error" and an `error`
naming the stage and the cause; the other two must finish with the tokens
of the same run without the fault; the pool passes `check_integrity()`
after every step and holds no block at the end. A fault of the whole batch
(the model forward) propagates out of `step`.
"""

import pytest

import hybridkv.engine.llm as llm_module
import hybridkv.engine.outputs as outputs_module
from hybridkv import LLM, SamplingParams

PROMPTS = {"a": [5, 9, 14, 3, 77, 120, 8, 9], "v": [40, 41, 42, 43, 44, 45, 46, 47, 48],
           "b": [7, 300, 12, 99, 4]}
BASE = SamplingParams(max_tokens=8, ignore_eos=True)
FAULT = "injected fault"


class Fault(RuntimeError):
    pass


def make_llm(**kwargs):
    return LLM("gemma3-tiny", num_blocks=48, block_size=4, max_num_batched_tokens=16, **kwargs)


def run(llm, victim_params=BASE):
    seqs = {rid: llm.add_request(p, victim_params if rid == "v" else BASE, request_id=rid)
            for rid, p in PROMPTS.items()}
    while llm.has_unfinished_requests():
        llm.step()
        llm.kv.check_integrity()
    assert llm.kv.usage == 0
    return seqs


@pytest.fixture(scope="module")
def expected():
    return {rid: s.request.output_token_ids for rid, s in run(make_llm()).items()}


def check_isolated(seqs, expected, stage):
    victim = seqs["v"]
    assert victim.finish_reason == "error"
    assert victim.error is not None and stage in victim.error and FAULT in victim.error
    assert victim.finished_time is not None
    for rid in ("a", "b"):
        assert seqs[rid].finish_reason == "length" and seqs[rid].error is None
        assert seqs[rid].request.output_token_ids == expected[rid], rid


def raising(*args, **kwargs):
    raise Fault(FAULT)


def test_sampler_fault_mid_decode(expected):
    llm = make_llm()
    sample = llm.sampler.sample
    calls = {"v": 0}

    def faulty(logits, request_id, params, salt=0):
        if request_id == "v":
            calls["v"] += 1
            if calls["v"] == 3:  # the third token of "v"
                raise Fault(FAULT)
        return sample(logits, request_id, params, salt)

    llm.sampler.sample = faulty
    seqs = run(llm)
    check_isolated(seqs, expected, "sampling")
    assert len(seqs["v"].request.output_token_ids) == 2  # the tokens before the fault stay


@pytest.mark.parametrize("target, params, stage", [
    ("process_logits", dict(repetition_penalty=1.3), "sampling"),
    ("token_logprobs", dict(logprobs=2), "sampling"),
    ("find_stop_string", dict(stop=["never-appears"]), "stop check"),
])
def test_fault_in_one_requests_extras(expected, monkeypatch, target, params, stage):
    llm = make_llm()
    monkeypatch.setattr(outputs_module, target, raising)
    seqs = run(llm, SamplingParams(max_tokens=8, ignore_eos=True, **params))
    check_isolated(seqs, expected, stage)


def test_prompt_logprobs_fault(expected, monkeypatch):
    llm = make_llm()
    monkeypatch.setattr(llm_module, "add_prompt_logprobs", raising)
    seqs = run(llm, SamplingParams(max_tokens=8, ignore_eos=True, prompt_logprobs=1))
    check_isolated(seqs, expected, "prompt logprobs")
    assert seqs["v"].request.output_token_ids == []


class FaultyTokenizer:
    """The real tokenizer, except that decoding raises."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, *args, **kwargs):
        raise Fault(FAULT)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_tokenizer_fault_while_checking_stop_strings(expected, monkeypatch):
    llm = make_llm()
    monkeypatch.setattr(llm.outputs, "tokenizer", FaultyTokenizer(llm.tokenizer))
    seqs = run(llm, SamplingParams(max_tokens=8, ignore_eos=True, stop=["never-appears"]))
    check_isolated(seqs, expected, "stop check")


def test_tokenizer_fault_in_generate_output_names_detokenizing(monkeypatch):
    llm = make_llm()
    monkeypatch.setattr(llm.outputs, "tokenizer", FaultyTokenizer(llm.tokenizer))
    out = llm.generate([PROMPTS["a"]], BASE)[0]
    assert out.finish_reason == "error" and out.text is None
    assert "detokenizing" in out.error and FAULT in out.error
    assert len(out.output_token_ids) == BASE.max_tokens
    assert llm.kv.usage == 0


def test_kv_store_lookup_fault(expected, monkeypatch):
    llm = make_llm(kv_store="cpu://?size=1MiB")
    extend_hit = llm.tier.extend_hit

    def faulty(request, *args, **kwargs):
        if request.request_id == "v":
            raise Fault(FAULT)
        return extend_hit(request, *args, **kwargs)

    monkeypatch.setattr(llm.tier, "extend_hit", faulty)
    seqs = run(llm)
    check_isolated(seqs, expected, "KV cache lookup")
    assert seqs["v"].request.output_token_ids == []
    llm.close()


def test_generate_reports_the_failed_request_and_finishes_the_others(expected, monkeypatch):
    llm = make_llm()
    monkeypatch.setattr(outputs_module, "process_logits", raising)
    params = [BASE, SamplingParams(max_tokens=8, ignore_eos=True, presence_penalty=1.0), BASE]
    outs = llm.generate(list(PROMPTS.values()), params)
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "sampling failed" in outs[1].error and FAULT in outs[1].error
    assert outs[0].error is None and outs[0].output_token_ids == expected["a"]
    assert outs[2].output_token_ids == expected["b"]
    assert llm.kv.usage == 0


def test_a_fault_of_the_whole_batch_propagates(monkeypatch):
    llm = make_llm()
    llm.add_request(PROMPTS["a"], BASE, request_id="a")
    monkeypatch.setattr(llm.executor, "execute", raising)
    with pytest.raises(Fault):
        llm.step()
