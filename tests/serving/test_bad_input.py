"""The bad-input catalogue: every case gets its documented status and an OpenAI
error body naming the field; afterwards the server is healthy and holds nothing."""

import json

import httpx
import pytest

GEMMA = "gemma3-tiny"
OK = {"model": GEMMA, "prompt": [5, 6, 7], "max_tokens": 2}


def _with(**changes):
    body = {**OK, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not ...})


# (name, path, raw body, status, param)
CASES = [
    ("malformed JSON", "/v1/completions", '{"prompt": [1, 2', 400, "body"),
    ("body is not an object", "/v1/completions", "[1, 2, 3]", 400, None),
    ("empty body", "/v1/completions", "", 400, "body"),
    ("missing prompt", "/v1/completions", _with(prompt=...), 400, "prompt"),
    ("missing messages", "/v1/chat/completions", json.dumps({"model": GEMMA}), 400,
     "messages"),
    ("prompt of the wrong type", "/v1/completions", _with(prompt=12), 400, "prompt"),
    ("prompt mixing types", "/v1/completions", _with(prompt=[1, "a"]), 400, "prompt"),
    ("empty prompt string", "/v1/completions", _with(prompt=""), 400, "prompt"),
    ("empty token list", "/v1/completions", _with(prompt=[]), 400, "prompt"),
    ("negative token id", "/v1/completions", _with(prompt=[1, -4, 2]), 400, "prompt"),
    ("token id outside the vocabulary", "/v1/completions", _with(prompt=[1, 512]), 400,
     "prompt"),
    ("prompt longer than the context", "/v1/completions", _with(prompt=[7] * 4100), 400,
     "prompt"),
    ("max_tokens 0", "/v1/completions", _with(max_tokens=0), 400, "max_tokens"),
    ("max_tokens negative", "/v1/completions", _with(max_tokens=-3), 400, "max_tokens"),
    ("max_tokens beyond the context", "/v1/completions", _with(max_tokens=10**7), 400,
     "max_tokens"),
    ("max_tokens as a string", "/v1/completions", _with(max_tokens="5"), 400, "max_tokens"),
    ("temperature below 0", "/v1/completions", _with(temperature=-0.5), 400, "temperature"),
    ("temperature NaN", "/v1/completions", _with(temperature=0)[:-1] + ', "temperature": NaN}',
     400, "temperature"),
    ("top_p 0", "/v1/completions", _with(top_p=0), 400, "top_p"),
    ("top_p above 1", "/v1/completions", _with(top_p=1.5), 400, "top_p"),
    ("top_k below -1", "/v1/completions", _with(top_k=-5), 400, "top_k"),
    ("n too large", "/v1/completions", _with(n=100), 400, "n"),
    ("more sequences than the server holds", "/v1/completions",
     _with(prompt=[[5, 6]] * 64, n=16), 400, "n"),
    ("seed of a later sample out of range", "/v1/completions", _with(seed=2**64 - 1, n=2),
     400, "seed"),
    ("seed of the wrong type", "/v1/completions", _with(seed="7"), 400, "seed"),
    ("stream not a bool", "/v1/completions", _with(stream="yes"), 400, "stream"),
    ("empty stop string", "/v1/completions", _with(stop=[""]), 400, "stop"),
    ("stop token outside the vocabulary", "/v1/completions", _with(stop_token_ids=[9999]),
     400, "stop_token_ids"),
    ("empty cache_salt", "/v1/completions", _with(cache_salt=""), 400, "cache_salt"),
    ("logprobs negative", "/v1/completions", _with(logprobs=-1), 400, "logprobs"),
    ("logprobs above 20", "/v1/completions", _with(logprobs=21), 400, "logprobs"),
    ("logprobs as a bool in completions", "/v1/completions", _with(logprobs=True), 400,
     "logprobs"),
    ("echo not a bool", "/v1/completions", _with(echo="yes"), 400, "echo"),
    ("repetition_penalty 0", "/v1/completions", _with(repetition_penalty=0), 400,
     "repetition_penalty"),
    ("repetition_penalty negative", "/v1/completions", _with(repetition_penalty=-1.5), 400,
     "repetition_penalty"),
    ("presence_penalty above 2", "/v1/completions", _with(presence_penalty=2.5), 400,
     "presence_penalty"),
    ("frequency_penalty below -2", "/v1/completions", _with(frequency_penalty=-3), 400,
     "frequency_penalty"),
    ("frequency_penalty as a string", "/v1/completions", _with(frequency_penalty="1"), 400,
     "frequency_penalty"),
    ("min_tokens negative", "/v1/completions", _with(min_tokens=-1), 400, "min_tokens"),
    ("min_tokens above max_tokens", "/v1/completions", _with(min_tokens=5, max_tokens=2), 400,
     "min_tokens"),
    ("logit_bias key not a token id", "/v1/completions", _with(logit_bias={"abc": 1}), 400,
     "logit_bias"),
    ("logit_bias value above 100", "/v1/completions", _with(logit_bias={"5": 101}), 400,
     "logit_bias"),
    ("logit_bias token outside the vocabulary", "/v1/completions",
     _with(logit_bias={"99999": 1}), 400, "logit_bias"),
    ("skip_special_tokens not a bool", "/v1/completions", _with(skip_special_tokens="no"),
     400, "skip_special_tokens"),
    ("ignore_eos not a bool", "/v1/completions", _with(ignore_eos=1), 400, "ignore_eos"),
    ("stream_options.include_usage not a bool", "/v1/completions",
     _with(stream=True, stream_options={"include_usage": "yes"}), 400,
     "stream_options.include_usage"),
    ("min_p (unsupported)", "/v1/completions", _with(min_p=0.1), 400, "min_p"),
    ("tools (unsupported)", "/v1/completions",
     _with(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("tool_choice (unsupported)", "/v1/completions", _with(tool_choice="required"), 400,
     "tool_choice"),
    ("functions (unsupported)", "/v1/completions", _with(functions=[{"name": "f"}]), 400,
     "functions"),
    ("response_format json_schema (unsupported)", "/v1/completions",
     _with(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400,
     "response_format"),
    ("chat logprobs as an int", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}), 400,
     "logprobs"),
    ("chat top_logprobs above 20", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                 "top_logprobs": 21}), 400, "top_logprobs"),
    ("chat top_logprobs without logprobs", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}), 400,
     "top_logprobs"),
    ("chat max_completion_tokens 0", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "hi"}],
                 "max_completion_tokens": 0}), 400, "max_completion_tokens"),
    ("prompt longer than --max-prompt-chars", "/v1/completions", _with(prompt="a" * 150_000),
     400, "prompt"),
    ("chat text longer than --max-prompt-chars", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "a" * 150_000}]}), 400, "messages"),
    ("prompt with a lone surrogate", "/v1/completions", '{"prompt": "a\\ud800b"}', 400,
     "body"),
    ("unknown field", "/v1/completions", _with(temprature=0.5), 400, "temprature"),
    ("unknown model", "/v1/completions", _with(model="gpt-4"), 404, "model"),
    ("unknown model in chat", "/v1/chat/completions",
     json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}), 404,
     "model"),
    ("empty messages", "/v1/chat/completions", json.dumps({"model": GEMMA, "messages": []}),
     400, "messages"),
    ("chat message with an unknown role", "/v1/chat/completions",
     json.dumps({"model": GEMMA, "messages": [{"role": "wizard", "content": "hi"}]}), 400,
     "messages[0].role"),
    ("chat content of the wrong type", "/v1/chat/completions",
     json.dumps({"model": GEMMA, "messages": [{"role": "user", "content": 5}]}), 400,
     "messages[0].content"),
    ("tokenize with neither prompt nor messages", "/tokenize", "{}", 400, None),
]


def _check_error(response, status, param):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    if param is not None:
        assert param.split("[")[0] in error["message"]
    return error


@pytest.mark.parametrize("name, path, body, status, param", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_the_field(gemma_server, name, path, body, status, param):
    response = gemma_server.post(path, content=body,
                                 headers={"Content-Type": "application/json"})
    _check_error(response, status, param)


def test_body_over_the_limit_is_413(gemma_server):
    big = _with(prompt=[5] * 80_000)
    assert len(big) > 200_000
    _check_error(gemma_server.post("/v1/completions", content=big), 413, "body")

    def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(30):
            yield b" " * 10_000

    _check_error(gemma_server.post("/v1/completions", content=chunks()), 413, "body")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "test-key"}])
def test_missing_or_wrong_api_key_is_401(gemma_server, headers):
    response = httpx.post(f"{gemma_server.url}/v1/completions", json=OK, headers=headers)
    error = _check_error(response, 401, None)
    assert error["code"] == "invalid_api_key"
    assert httpx.get(f"{gemma_server.url}/v1/models", headers=headers).status_code == 401
    assert httpx.get(f"{gemma_server.url}/health").status_code == 200  # open


def test_chat_unknown_role_on_a_chat_model(text_server):
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}
    _check_error(text_server.post("/v1/chat/completions", json=body), 400, "messages[1].role")


def test_server_is_healthy_and_holds_nothing_after_the_catalogue(gemma_server):
    for _, path, body, _, _ in CASES:
        gemma_server.post(path, content=body)
    m = gemma_server.wait_idle()
    assert m["hybridkv_kv_cache_blocks_held"] == 0
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert gemma_server.get("/health").status_code == 200
    out = gemma_server.post("/v1/completions", json=OK).json()
    assert out["usage"]["completion_tokens"] == 2
