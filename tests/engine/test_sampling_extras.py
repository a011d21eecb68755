"""vLLM's sampling extras against independent references.

The reference decode runs the Hugging Face model with no cache over the
whole sequence at every step and applies Hugging Face's own logits
processors (RepetitionPenaltyLogitsProcessor, MinNewTokensLengthLogitsProcessor,
SequenceBiasLogitsProcessor) in vLLM's order (min_tokens, logit_bias,
repetition penalty), then OpenAI's presence / frequency formula written out
below token by token, then argmax.
"""

import pytest
import torch
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import build_preset_model

PROMPTS = [[5, 9, 14, 3, 77, 120, 9, 14, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48, 41, 42],
           [7, 300, 12, 99, 4]]


@pytest.fixture(scope="module")
def model():
    return build_preset_model("gemma3-tiny", seed=0)


@pytest.fixture(scope="module")
def llm(model):
    return LLM(model, block_size=4, num_blocks=96, max_num_batched_tokens=8)


def openai_penalties(logits, output, frequency, presence):
    """logit[t] -= frequency * count(t) + presence * (count(t) > 0), per token."""
    out = logits.clone()
    for token in set(output):
        count = output.count(token)
        out[token] -= frequency * count + presence * (1 if count > 0 else 0)
    return out


def hf_reference(model, prompt, params, eos_ids):
    """Greedy tokens under `params`' extras, from HF's forward and processors."""
    processors = []
    if params.min_tokens:
        processors.append(MinNewTokensLengthLogitsProcessor(
            len(prompt), params.min_tokens, sorted({*eos_ids, *params.stop_token_ids})))
    if params.logit_bias:
        processors.append(SequenceBiasLogitsProcessor(
            [[[token], bias] for token, bias in params.logit_bias.items()]))
    if params.repetition_penalty != 1:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    tokens = list(prompt)
    with torch.no_grad():
        while len(tokens) - len(prompt) < params.max_tokens:
            ids = torch.tensor([tokens])
            scores = model(ids, use_cache=False).logits[:, -1].float()
            for processor in processors:
                scores = processor(ids, scores)
            output = tokens[len(prompt):]
            scores = openai_penalties(scores[0], output, params.frequency_penalty,
                                      params.presence_penalty)
            tokens.append(int(torch.argmax(scores)))
            if not params.ignore_eos and tokens[-1] in eos_ids:
                break
    return tokens[len(prompt):]


@pytest.mark.parametrize("extras", [
    dict(repetition_penalty=1.8), dict(repetition_penalty=0.6),
    dict(frequency_penalty=1.5), dict(presence_penalty=2.0), dict(presence_penalty=-1.0),
    dict(frequency_penalty=0.7, presence_penalty=0.4, repetition_penalty=1.3),
    dict(logit_bias={17: 4.0, 300: -5.0}, repetition_penalty=1.2),
], ids=["rep-1.8", "rep-0.6", "freq", "presence", "negative-presence", "all-penalties",
        "bias-and-rep"])
def test_greedy_with_extras_equals_hugging_face_processors(model, llm, extras):
    params = SamplingParams(max_tokens=10, ignore_eos=True, **extras)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        assert out.output_token_ids == hf_reference(model, prompt, params,
                                                    llm.runner.eos_token_ids)
    plain = llm.generate(PROMPTS, SamplingParams(max_tokens=10, ignore_eos=True))
    assert [o.output_token_ids for o in outs] != [o.output_token_ids for o in plain], \
        "the extras must change something for the comparison to mean anything"
    assert llm.kv.usage == 0


def test_a_batch_mixing_plain_greedy_with_extras_equals_hugging_face(model, llm):
    """Plain greedy rows take one batched argmax; the row between them with extras must
    still be sampled from its own processed logits."""
    plain = SamplingParams(max_tokens=10, ignore_eos=True)
    extras = SamplingParams(max_tokens=10, ignore_eos=True, logit_bias={17: 4.0},
                            repetition_penalty=1.5)
    per_prompt = [plain, extras, plain]
    outs = llm.generate(PROMPTS, per_prompt)
    for prompt, params, out in zip(PROMPTS, per_prompt, outs):
        assert out.output_token_ids == hf_reference(model, prompt, params,
                                                    llm.runner.eos_token_ids)


def test_repetition_penalty_equals_hugging_face_generate(model, llm):
    prompt = PROMPTS[1]
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10,
                              do_sample=False, repetition_penalty=1.5)[0, len(prompt):]
    out = llm.generate([prompt], SamplingParams(max_tokens=10, ignore_eos=True,
                                                repetition_penalty=1.5))[0]
    assert out.output_token_ids == expected.tolist()


def test_min_tokens_holds_back_a_forced_eos(model, llm):
    eos = llm.runner.eos_token_ids[0]
    params = SamplingParams(max_tokens=8, min_tokens=4, logit_bias={eos: 100.0})
    out = llm.generate([PROMPTS[0]], params)[0]
    assert out.output_token_ids == hf_reference(model, PROMPTS[0], params,
                                                llm.runner.eos_token_ids)
    assert len(out.output_token_ids) == 5 and out.output_token_ids[-1] == eos
    assert eos not in out.output_token_ids[:4] and out.finish_reason == "stop"
    forced = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=8, logit_bias={eos: 100.0}))
    assert forced[0].output_token_ids == [eos]  # without min_tokens it bites at once


def test_min_tokens_holds_back_stop_token_ids(llm):
    params = SamplingParams(max_tokens=8, min_tokens=3, stop_token_ids=[33],
                            logit_bias={33: 100.0})
    out = llm.generate([PROMPTS[2]], params)[0]
    assert 33 not in out.output_token_ids[:3]
    assert out.output_token_ids[3] == 33 and len(out.output_token_ids) == 4
    assert out.finish_reason == "stop" and out.stop_reason == 33


def test_a_large_bias_forces_the_token_greedy_and_sampled(llm):
    for temperature in (0.0, 1.0):
        params = SamplingParams(max_tokens=6, ignore_eos=True, temperature=temperature,
                                seed=3, logit_bias={123: 100.0})
        out = llm.generate([PROMPTS[0]], params)[0]
        assert out.output_token_ids == [123] * 6


def test_min_tokens_delays_stop_strings():
    llm = LLM("gemma3-tiny", block_size=4, num_blocks=64)
    tok = llm.tokenizer
    prompt = [5, 9, 14, 3, 77, 120]
    ref = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stop = tok.decode(ref.output_token_ids[:1], skip_special_tokens=True)
    assert stop, "the first token must decode to some text"
    early = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True,
                                                  stop=[stop]))[0]
    assert early.output_token_ids == ref.output_token_ids[:1] and early.text == ""
    out = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop],
                                                min_tokens=3))[0]
    # brute force: the first k >= 3 whose text after the first 3 tokens' text holds `stop`
    skip = len(tok.decode(ref.output_token_ids[:3], skip_special_tokens=True))
    for k in range(3, 13):
        text = tok.decode(ref.output_token_ids[:k], skip_special_tokens=True)
        if stop in text[skip:]:
            assert out.output_token_ids == ref.output_token_ids[:k]
            assert out.text == text[:text.index(stop, skip)] and out.stop_reason == stop
            break
    else:
        assert out.output_token_ids == ref.output_token_ids and out.finish_reason == "length"


def test_skip_special_tokens_false_keeps_them_in_the_text():
    llm = LLM("gemma3-tiny", block_size=4, num_blocks=64)
    special = llm.tokenizer.all_special_ids[0]
    params = dict(max_tokens=3, ignore_eos=True, logit_bias={special: 100.0})
    kept = llm.generate([[5, 9, 14]], SamplingParams(skip_special_tokens=False, **params))[0]
    dropped = llm.generate([[5, 9, 14]], SamplingParams(**params))[0]
    assert kept.output_token_ids == dropped.output_token_ids == [special] * 3
    assert kept.text == llm.tokenizer.convert_ids_to_tokens(special) * 3
    assert dropped.text == ""


@pytest.mark.parametrize("kwargs, field", [
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=-1), "repetition_penalty"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty"),
    (dict(repetition_penalty="2"), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-2.01), "frequency_penalty"),
    (dict(frequency_penalty=True), "frequency_penalty"),
    (dict(min_tokens=-1), "min_tokens"), (dict(min_tokens=17), "min_tokens"),
    (dict(min_tokens=1.0), "min_tokens"),
    (dict(logit_bias={1: 101}), "logit_bias"), (dict(logit_bias={-3: 1}), "logit_bias"),
    (dict(logit_bias={"5": 1}), "logit_bias"), (dict(logit_bias=[1, 2]), "logit_bias"),
    (dict(logit_bias={1: float("inf")}), "logit_bias"),
    (dict(logprobs=-1), "logprobs"), (dict(logprobs=21), "logprobs"),
    (dict(prompt_logprobs=21), "prompt_logprobs"), (dict(prompt_logprobs=1.5), "prompt_logprobs"),
    (dict(skip_special_tokens=None), "skip_special_tokens"),
])
def test_bad_extras_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}"):
        SamplingParams(**kwargs)


def test_params_with_a_bias_stay_hashable_and_compare_by_value():
    a = SamplingParams(logit_bias={3: 1, 7: -2.5})
    b = SamplingParams(logit_bias={7: -2.5, 3: 1.0})
    assert a == b and hash(a) == hash(b) and dict(a.logit_bias) == {3: 1.0, 7: -2.5}
    assert SamplingParams(repetition_penalty=1.1) != SamplingParams()


def test_a_bias_outside_the_vocabulary_is_refused_naming_the_id(llm):
    params = SamplingParams(logit_bias={3: 1.0, 512: 2.0})
    with pytest.raises(ValueError, match="logit_bias has token id 512"):
        llm.add_request([1, 2, 3], params)
    with pytest.raises(ValueError, match="logit_bias has token id 512"):
        llm.generate([[1, 2, 3]], params)
    assert not llm.has_unfinished_requests()
