"""OpenAI's and vLLM's request fields through the official `openai` client,
checked against the in-process engine (`LLM` with the same SamplingParams)
and the tokenizer's own chat template."""

import math

import openai
import pytest
from transformers import AutoTokenizer

from hybridkv import LLM, SamplingParams

MODEL = "tiny-chat"
PROMPT = "Beautiful is better than ugly. Simple is"
USER = [{"role": "user", "content": "Is flat better than nested?"}]
ENGINE_FIELDS = set(SamplingParams.__dataclass_fields__)
needs_engine = pytest.mark.skipif(
    not {"logprobs", "repetition_penalty", "min_tokens"} <= ENGINE_FIELDS,
    reason="this engine build has no logprobs / penalties in SamplingParams")


@pytest.fixture(scope="module")
def local(text_checkpoint):
    return LLM(str(text_checkpoint))


@pytest.fixture(scope="module")
def tokenizer(text_checkpoint):
    return AutoTokenizer.from_pretrained(str(text_checkpoint))


def _engine_run(llm, ids, params):
    """The engine's SeqState of one request run to its end (token ids, logprobs)."""
    seq = llm.add_request(ids, params)
    while llm.has_unfinished_requests():
        llm.step()
    return seq


def test_developer_role_renders_like_system(text_server, tokenizer):
    client = text_server.client()
    ids = {}
    for role in ("system", "developer"):
        out = client.chat.completions.create(
            model=MODEL, messages=[{"role": role, "content": "Be brief."}, *USER],
            max_completion_tokens=3, temperature=0, extra_body={"return_token_ids": True})
        ids[role] = out.choices[0].model_extra["prompt_token_ids"]
    text = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, *USER],
                                         tokenize=False, add_generation_prompt=True)
    assert ids["developer"] == ids["system"] == tokenizer.encode(text, add_special_tokens=False)


def test_max_completion_tokens_ignore_eos_and_usage_chunk(text_server):
    client = text_server.client()
    stream = client.chat.completions.create(
        model=MODEL, messages=USER, max_completion_tokens=7, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7
    assert chunks[-2].choices[0].finish_reason == "length"


def test_vllm_bench_client_defaults_are_accepted(text_server):
    # what `vllm bench serve --backend openai` sends with every request
    out = text_server.post("/v1/completions", json={
        "model": MODEL, "prompt": PROMPT, "repetition_penalty": 1.0, "max_tokens": 4,
        "logprobs": None, "stream": False, "ignore_eos": True, "temperature": 0.0,
        "top_p": 1.0, "presence_penalty": 0, "frequency_penalty": 0})
    assert out.status_code == 200, out.text
    assert out.json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("field, value", [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("response_format", {"type": "json_schema",
                         "json_schema": {"name": "x", "schema": {"type": "object"}}}),
    ("response_format", {"type": "json_object"})])
def test_fields_the_server_cannot_honour_are_a_400(text_server, field, value):
    with pytest.raises(openai.BadRequestError) as caught:
        text_server.client().chat.completions.create(model=MODEL, messages=USER,
                                                     max_tokens=2, **{field: value})
    assert caught.value.body["param"] == field and field in caught.value.body["message"]


@needs_engine
@pytest.mark.parametrize("extra", [
    {"repetition_penalty": 1.3}, {"presence_penalty": 1.5}, {"frequency_penalty": -1.0},
    {"min_tokens": 12, "max_tokens": 14}, {"logit_bias": {"40": 8.0, "41": -100}}])
def test_sampling_extras_equal_the_engine(text_server, local, tokenizer, extra):
    body = {"max_tokens": 12, **extra}
    out = text_server.client().completions.create(
        model=MODEL, prompt=PROMPT, temperature=0,
        extra_body={"return_token_ids": True, **body})  # vLLM's extras ride in extra_body
    bias = body.pop("logit_bias", None)
    params = SamplingParams(**body, logit_bias=None if bias is None else
                            {int(k): v for k, v in bias.items()})
    want = _engine_run(local, tokenizer.encode(PROMPT), params)
    assert out.choices[0].model_extra["token_ids"] == want.request.output_token_ids


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)


@needs_engine
def test_completion_logprobs_equal_the_engine(text_server, local, tokenizer):
    out = text_server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=6,
                                                  temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    want = _engine_run(local, tokenizer.encode(PROMPT),
                       SamplingParams(max_tokens=6, logprobs=3)).logprobs
    assert len(lp.tokens) == len(want) == 6
    for i, entry in enumerate(want):
        assert lp.tokens[i] == tokenizer.decode([entry.token_id])
        assert _close(lp.token_logprobs[i], entry.logprob)
        best = {}  # tokens sharing a text share its key: the likeliest one's value
        for token_id, value in [*entry.top, (entry.token_id, entry.logprob)]:
            text = tokenizer.decode([token_id])
            best[text] = max(best.get(text, value), value)
        assert set(lp.top_logprobs[i]) == set(best)
        for text, value in best.items():
            assert _close(lp.top_logprobs[i][text], value)
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(6)]
    assert "".join(lp.tokens).startswith(out.choices[0].text)


@needs_engine
def test_echo_with_logprobs_uses_prompt_logprobs(text_server, local, tokenizer):
    ids = tokenizer.encode(PROMPT)
    out = text_server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=3,
                                                  temperature=0, logprobs=1, echo=True)
    choice = out.choices[0]
    want = _engine_run(local, ids, SamplingParams(max_tokens=3, logprobs=1,
                                                  prompt_logprobs=1))
    assert choice.text.startswith(PROMPT)
    assert len(choice.logprobs.tokens) == len(ids) + 3
    assert choice.logprobs.token_logprobs[0] is None
    for got, entry in zip(choice.logprobs.token_logprobs[1:len(ids)], want.prompt_logprobs[1:]):
        assert _close(got, entry.logprob)


@needs_engine
def test_chat_logprobs_parse_and_stream_the_same(text_server, local, tokenizer):
    client = text_server.client()
    kwargs = dict(model=MODEL, messages=USER, max_completion_tokens=5, temperature=0,
                  logprobs=True, top_logprobs=2)
    plain = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    streamed = [entry for chunk in client.chat.completions.create(**kwargs, stream=True)
                if chunk.choices and chunk.choices[0].logprobs
                for entry in chunk.choices[0].logprobs.content]
    ids = tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    want = _engine_run(local, tokenizer.encode(ids, add_special_tokens=False),
                       SamplingParams(max_tokens=5, logprobs=2)).logprobs
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in plain]
    assert len(plain) == len(want)
    for got, entry in zip(plain, want):
        assert got.token == tokenizer.decode([entry.token_id])
        assert got.bytes == list(got.token.encode())
        assert _close(got.logprob, entry.logprob)
        assert [t.token for t in got.top_logprobs] == \
            [tokenizer.decode([t]) for t, _ in entry.top[:2]]
