"""Text prompts and chat with a real tokenizer (a checkpoint directory holding a
preset's weights and a small trained byte-level BPE with a chat template)."""

import pytest
from transformers import AutoTokenizer

from hybridkv import LLM, SamplingParams

MODEL = "tiny-chat"
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Is flat better than nested?"}]


@pytest.fixture(scope="module")
def local(text_checkpoint):
    return LLM(str(text_checkpoint))


@pytest.fixture(scope="module")
def tokenizer(text_checkpoint):
    return AutoTokenizer.from_pretrained(str(text_checkpoint))


def _chat_ids(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def test_text_completion_equals_generate(text_server, local, tokenizer):
    prompt = "Beautiful is better than ugly. Simple is"
    want = local.generate([prompt], SamplingParams(max_tokens=16))[0]
    out = text_server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                                  temperature=0,
                                                  extra_body={"return_token_ids": True})
    choice = out.choices[0]
    assert choice.model_extra["prompt_token_ids"] == tokenizer.encode(prompt)
    assert choice.model_extra["token_ids"] == want.output_token_ids
    assert choice.text == tokenizer.decode(want.output_token_ids, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(tokenizer.encode(prompt))


def test_chat_equals_generate_of_the_rendered_template(text_server, local, tokenizer):
    ids = _chat_ids(tokenizer, MESSAGES)
    want = local.generate([ids], SamplingParams(max_tokens=20))[0].output_token_ids
    out = text_server.client().chat.completions.create(model=MODEL, messages=MESSAGES,
                                                       max_tokens=20, temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == tokenizer.decode(want, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(ids)
    assert out.usage.completion_tokens == len(want)


def test_streamed_chat_joins_to_the_plain_answer(text_server):
    client = text_server.client()
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24,
                                           temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        plain.choices[0].finish_reason


def test_stop_string_cuts_the_text(text_server, local):
    client = text_server.client()
    prompt = "Errors should never pass silently. Unless"
    full = local.generate([prompt], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 2]
    assert stop.strip(), "the middle of the output is printable"
    want = full.text[:full.text.find(stop)]
    for stream in (False, True):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30,
                                        temperature=0, stop=[stop], stream=stream,
                                        extra_body={"ignore_eos": True})
        chunks = list(out) if stream else [out]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == want
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert chunks[-1].choices[0].model_extra["stop_reason"] == stop


def test_cached_tokens_for_a_repeated_conversation(text_server):
    client = text_server.client()
    messages = [{"role": "user", "content": "Readability counts. " * 40}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    salted = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                            extra_body={"cache_salt": "other"})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens >= 16
    assert salted.usage.prompt_tokens_details.cached_tokens == 0


def test_tokenize_prompt_and_messages(text_server, tokenizer):
    r = text_server.post("/tokenize", json={"prompt": "Now is better than never."})
    assert r.json()["tokens"] == tokenizer.encode("Now is better than never.")
    r = text_server.post("/tokenize", json={"messages": MESSAGES})
    ids = _chat_ids(tokenizer, MESSAGES)
    assert r.json() == {"tokens": ids, "count": len(ids), "max_model_len": 4096}
