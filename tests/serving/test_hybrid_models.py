"""Greedy outputs over HTTP equal LLM.generate for the hybrid presets: gpt-oss-tiny
(sliding window + learned sinks) and jamba-tiny (Mamba + full attention)."""

import random

import pytest

from hybridkv import SamplingParams

CASES = [("gpt-oss-tiny", "gpt_oss_server"), ("jamba-tiny", "jamba_server")]


def _prompts(seed, count, low, high):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(low, high))]
            for _ in range(count)]


@pytest.mark.parametrize("model, fixture", CASES)
def test_greedy_over_http_equals_generate(model, fixture, request, reference):
    server = request.getfixturevalue(fixture)
    client = server.client()
    prompts = _prompts(11, 3, 10, 90)
    want = [o.output_token_ids
            for o in reference(model).generate(prompts, SamplingParams(max_tokens=12))]
    plain = client.completions.create(model=model, prompt=prompts, max_tokens=12,
                                      temperature=0, extra_body={"return_token_ids": True})
    assert [c.model_extra["token_ids"] for c in plain.choices] == want
    for prompt, tokens in zip(prompts, want):
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=12,
                                           temperature=0, stream=True,
                                           extra_body={"return_token_ids": True})
        assert [t for c in stream if c.choices for t in c.choices[0].model_extra["token_ids"]] \
            == tokens


@pytest.mark.parametrize("model, fixture", CASES)
def test_repeated_prompt_is_served_from_cache_with_the_same_tokens(model, fixture, request):
    server = request.getfixturevalue(fixture)
    client = server.client()
    prompt = _prompts(12, 1, 150, 151)[0]
    outs = [client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"return_token_ids": True})
            for _ in range(2)]
    assert outs[0].usage.prompt_tokens_details.cached_tokens == 0
    assert outs[1].usage.prompt_tokens_details.cached_tokens >= 128
    assert outs[0].choices[0].model_extra["token_ids"] == \
        outs[1].choices[0].model_extra["token_ids"]
    assert server.wait_idle()["hybridkv_kv_cache_blocks_held"] == 0


@pytest.mark.parametrize("model, fixture", [("gemma3-tiny", "gemma_server"), *CASES])
def test_preset_text_and_chat_equal_generate_and_chat(model, fixture, request, reference):
    server = request.getfixturevalue(fixture)
    llm = reference(model)
    assert llm.tokenizer is not None, "every preset ships a tokenizer"
    client = server.client()
    prompt = "The cache keeps what the window still needs."
    want = llm.generate([prompt], SamplingParams(max_tokens=10))[0]
    out = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0,
                                    extra_body={"return_token_ids": True})
    assert out.choices[0].model_extra["token_ids"] == want.output_token_ids
    assert out.choices[0].text == want.text
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Which layers slide?"}]
    want = llm.chat(messages, SamplingParams(max_tokens=10))[0]
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=10,
                                         temperature=0, extra_body={"return_token_ids": True})
    assert out.choices[0].model_extra["token_ids"] == want.output_token_ids
    assert out.choices[0].message.content == want.text
    assert out.usage.prompt_tokens == len(want.prompt_token_ids)
