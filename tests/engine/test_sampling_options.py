"""top_p / top_k / stop / n in SamplingParams, and the one-request engine API
(add_request, step, abort_request) the server drives."""

import pytest
import torch

from hybridkv import LLM, SamplingParams
from hybridkv.engine.sampling import Sampler, _top_k_top_p, find_stop_string
from hybridkv.models.presets import build_preset_model

PROMPTS = [[5, 9, 14, 3, 77, 120], [40, 41, 42, 43, 44, 45, 46, 47, 48]]


@pytest.fixture(scope="module")
def llm():
    return LLM("gemma3-tiny", num_blocks=64, block_size=8)


@pytest.mark.parametrize("kwargs, match", [
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_p": float("nan")}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"top_k": 1.5}, "top_k"), ({"n": 0}, "n"),
    ({"stop": [""]}, "stop"), ({"stop": 5}, "stop"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": "ab"}, "stop_token_ids"), ({"seed": 2**64}, "seed"),
    ({"seed": True}, "seed"),
])
def test_bad_sampling_options_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_stop_accepts_one_string_or_a_list():
    assert SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams(stop=["a", "b"], stop_token_ids=[3]).stop_token_ids == (3,)


def test_top_k_top_p_keep_exactly_the_right_set():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0, -1.0])
    kept = torch.isfinite(_top_k_top_p(logits, 2, 1.0)).nonzero().flatten().tolist()
    assert kept == [1, 3]
    probs = torch.softmax(logits, -1)  # sorted: 1 (.64), 3 (.24), 2 (.09), ...
    kept = torch.isfinite(_top_k_top_p(logits, 0, float(probs[1]) + 0.01)).nonzero()
    assert kept.flatten().tolist() == [1, 3]  # the smallest set reaching top_p
    assert torch.isfinite(_top_k_top_p(logits, 0, 1e-6)).nonzero().flatten().tolist() == [1]


def test_top_k_1_samples_the_argmax():
    logits = torch.randn(512, generator=torch.Generator().manual_seed(3))
    sampler = Sampler()
    params = SamplingParams(temperature=2.0, top_k=1, seed=4)
    assert {sampler.sample(logits, f"r{i}", params) for i in range(20)} == \
        {int(logits.argmax())}


def test_find_stop_string_takes_the_first_occurrence():
    assert find_stop_string("abcabc", ["c", "b"]) == (1, "b")
    assert find_stop_string("abc", ["x"]) is None


def test_greedy_n_gives_n_identical_outputs_in_prompt_order(llm):
    single = llm.generate(PROMPTS, SamplingParams(max_tokens=5))
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=5, n=3))
    assert [o.output_token_ids for o in outs] == \
        [single[0].output_token_ids] * 3 + [single[1].output_token_ids] * 3


def test_seeded_samples_of_n_differ_and_repeat(llm):
    params = SamplingParams(max_tokens=12, temperature=3.0, seed=11, n=3, ignore_eos=True)
    a = [o.output_token_ids for o in llm.generate(PROMPTS[:1], params)]
    b = [o.output_token_ids for o in llm.generate(PROMPTS[:1], params)]
    assert a == b
    assert len({tuple(x) for x in a}) == 3


def test_stop_token_ids_end_generation(llm):
    full = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    stop = full.output_token_ids[4]
    out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=10, ignore_eos=True,
                                                   stop_token_ids=[stop]))[0]
    cut = full.output_token_ids.index(stop) + 1
    assert out.output_token_ids == full.output_token_ids[:cut]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_stop_strings_need_a_tokenizer():
    bare = LLM(build_preset_model("gemma3-tiny", seed=0), num_blocks=16, block_size=8)
    assert bare.tokenizer is None
    with pytest.raises(ValueError, match="stop strings"):
        bare.generate(PROMPTS[:1], SamplingParams(stop=["x"]))


def test_stop_string_cuts_text_and_tokens(llm):
    full = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    text = full.text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=24, ignore_eos=True,
                                                   stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[:text.find(stop)]
    # generation ends at the first token whose text completes the stop string
    n = len(out.output_token_ids)
    assert out.output_token_ids == full.output_token_ids[:n]
    decode = llm.tokenizer.decode
    assert stop in decode(full.output_token_ids[:n], skip_special_tokens=True)
    assert stop not in decode(full.output_token_ids[:n - 1], skip_special_tokens=True)


def test_add_step_abort_frees_every_block(llm):
    free = llm.kv.num_free_blocks
    seq = llm.add_request(PROMPTS[1], SamplingParams(max_tokens=50, ignore_eos=True),
                          request_id="a")
    other = llm.add_request({"prompt_token_ids": PROMPTS[0], "cache_salt": "s"},
                            SamplingParams(max_tokens=3), request_id="b")
    for _ in range(4):
        llm.step()
    assert seq.num_output_tokens == 4 and llm.kv.num_free_blocks < free
    assert llm.abort_request("a") and not llm.abort_request("a")
    assert seq.finish_reason == "abort"
    while llm.has_unfinished_requests():
        llm.step()
    assert other.finish_reason in ("stop", "length")
    assert llm.kv.num_free_blocks == free
    llm.kv.check_integrity()


def test_add_request_validates_like_generate(llm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.add_request([1, 2, 10**6])
    with pytest.raises(ValueError, match="n=1"):
        llm.add_request([1, 2], SamplingParams(n=2))
    assert not llm.has_unfinished_requests()


def test_greedy_generate_is_unchanged_by_sampling_fields(llm):
    plain = llm.generate(PROMPTS, SamplingParams(max_tokens=6))
    other = llm.generate(PROMPTS, SamplingParams(max_tokens=6, top_p=0.5, top_k=3, seed=9))
    assert [o.output_token_ids for o in plain] == [o.output_token_ids for o in other]
