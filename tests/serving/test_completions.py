"""/v1/completions through the official openai client against a real server
(gemma3-tiny: 3 sliding-window groups + 1 full-attention group)."""

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_process import ServerProcess

from hybridkv import SamplingParams

MODEL = "gemma3-tiny"


def _prompts(seed, count, low=5, high=60):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(low, high))]
            for _ in range(count)]


def _greedy(reference, prompts, max_tokens):
    outs = reference(MODEL).generate(prompts, SamplingParams(max_tokens=max_tokens))
    return [o.output_token_ids for o in outs]


def _token_ids(choice):
    return choice.model_extra["token_ids"]


def test_models_lists_the_served_model(gemma_server):
    models = gemma_server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_greedy_completions_equal_generate(gemma_server, reference):
    client = gemma_server.client()
    prompts = _prompts(1, 4)
    expected = _greedy(reference, prompts, 12)
    for prompt, want in zip(prompts, expected):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12,
                                        temperature=0, extra_body={"return_token_ids": True})
        choice = out.choices[0]
        assert _token_ids(choice) == want
        assert choice.finish_reason == ("stop" if len(want) < 12 else "length")
        assert out.usage.prompt_tokens == len(prompt)
        assert out.usage.completion_tokens == len(want)
        assert out.usage.total_tokens == len(prompt) + len(want)
        assert out.usage.prompt_tokens_details.cached_tokens >= 0


def test_streamed_completion_equals_generate(gemma_server, reference):
    client = gemma_server.client()
    prompt = _prompts(2, 1)[0]
    want = _greedy(reference, [prompt], 20)[0]
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"return_token_ids": True})
    chunks = list(stream)
    tokens = [t for c in chunks if c.choices for t in _token_ids(c.choices[0])]
    assert tokens == want
    assert len([c for c in chunks if c.choices]) >= 2, "tokens arrive in several chunks"
    assert chunks[-1].usage.completion_tokens == len(want)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_batch_of_prompts_and_n_choices(gemma_server, reference):
    prompts = _prompts(3, 3)
    want = _greedy(reference, prompts, 6)
    out = gemma_server.client().completions.create(
        model=MODEL, prompt=prompts, max_tokens=6, temperature=0, n=2,
        extra_body={"return_token_ids": True})
    assert [c.index for c in out.choices] == list(range(6))
    for c in out.choices:  # choice i*n + j is sample j of prompt i; greedy samples agree
        assert _token_ids(c) == want[c.index // 2]
    assert out.usage.prompt_tokens == sum(map(len, prompts))


def test_seeded_sampling_is_reproducible(gemma_server):
    client = gemma_server.client()
    kwargs = dict(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=10, temperature=1.5, top_p=0.9,
                  extra_body={"return_token_ids": True, "top_k": 50})
    a = client.completions.create(seed=7, **kwargs)
    b = client.completions.create(seed=7, **kwargs)
    assert _token_ids(a.choices[0]) == _token_ids(b.choices[0])


def test_stop_token_ids_end_the_output(gemma_server, reference):
    prompt = _prompts(4, 1)[0]
    want = _greedy(reference, [prompt], 10)[0]
    stop = want[3]
    out = gemma_server.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=10, temperature=0,
        extra_body={"return_token_ids": True, "stop_token_ids": [stop]})
    choice = out.choices[0]
    assert _token_ids(choice) == want[:want.index(stop) + 1]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == stop


def test_cached_tokens_on_repeat_and_salt_isolates(gemma_server):
    client = gemma_server.client()
    prompt = _prompts(5, 1, 300, 301)[0]

    def cached(salt):
        extra = {} if salt is None else {"cache_salt": salt}
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                        temperature=0, extra_body=extra)
        return out.usage.prompt_tokens_details.cached_tokens

    assert cached(None) == 0
    assert cached(None) >= 256, "a repeated 300-token prompt reuses its full blocks"
    assert cached("tenant-b") == 0
    assert cached("tenant-b") >= 256


def test_32_concurrent_clients_all_complete(gemma_server, reference):
    prompts = _prompts(6, 32, 20, 120)
    want = _greedy(reference, prompts, 16)
    client = gemma_server.client()

    def one(i):
        if i % 2:
            stream = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=16,
                                               temperature=0, stream=True,
                                               extra_body={"return_token_ids": True})
            return [t for c in stream if c.choices for t in _token_ids(c.choices[0])]
        out = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=16,
                                        temperature=0, extra_body={"return_token_ids": True})
        return _token_ids(out.choices[0])

    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(one, range(32)))
    assert got == want
    assert gemma_server.wait_idle()["hybridkv_kv_cache_blocks_held"] == 0


def test_disconnect_mid_stream_frees_the_blocks(gemma_server):
    before = gemma_server.metrics()
    body = {"model": MODEL, "prompt": _prompts(7, 1, 200, 201)[0], "max_tokens": 2000,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{gemma_server.url}/v1/completions", json=body,
                      headers=gemma_server.headers, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        during = gemma_server.metrics()
        assert during["hybridkv_kv_cache_blocks_held"] > 0
    after = gemma_server.wait_idle()
    assert after["hybridkv_kv_cache_blocks_held"] == 0
    assert after["vllm:num_requests_running"] == 0
    aborted = "vllm:request_success_total{finished_reason=abort}"
    assert after[aborted] == before[aborted] + 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 2000


def test_disconnect_while_waiting_for_a_plain_response(gemma_server):
    before = gemma_server.metrics()
    body = {"model": MODEL, "prompt": [3, 4, 5, 6], "max_tokens": 3000, "temperature": 0,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gemma_server.url}/v1/completions", json=body,
                   headers=gemma_server.headers, timeout=1.5)
    after = gemma_server.wait_idle()
    aborted = "vllm:request_success_total{finished_reason=abort}"
    assert after[aborted] == before[aborted] + 1
    assert after["hybridkv_kv_cache_blocks_held"] == 0


def test_metrics_parse_and_count(gemma_server: ServerProcess):
    client = gemma_server.client()
    before = gemma_server.metrics()
    out = client.completions.create(model=MODEL, prompt=_prompts(8, 1)[0], max_tokens=5,
                                    temperature=0)
    m = gemma_server.wait_idle()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum",
                 "hybridkv_prefix_cache_group_hits_total{group=3}",
                 "hybridkv_prefix_cache_group_queries_total{group=0}",
                 "hybridkv_kv_cache_group_info{block_size=16,group=3,type=full_attention}"):
        assert name in m, name
    assert m["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == \
        out.usage.prompt_tokens
    assert m["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == \
        out.usage.completion_tokens
    assert m["vllm:time_to_first_token_seconds_count"] == \
        before["vllm:time_to_first_token_seconds_count"] + 1
    assert m["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == \
        out.usage.prompt_tokens
    assert 0 <= m["vllm:kv_cache_usage_perc"] <= 1


def test_kv_cache_layout_describes_the_groups(gemma_server, reference):
    layout = gemma_server.get("/v1/kv_cache_layout").json()
    config = reference(MODEL).config
    assert layout["model"] == MODEL and layout["instance_id"] == f"127.0.0.1:{gemma_server.port}"
    assert layout["hash_algo"] == "sha256" and layout["hash_block_size"] == 16
    assert [g["type"] for g in layout["groups"]] == \
        ["sliding_window"] * 3 + ["full_attention"]
    assert all(g["sliding_window"] == 32 for g in layout["groups"][:3])
    assert layout["num_blocks"] == config.num_blocks


def test_tokenize_token_ids_and_text(gemma_server, reference):
    r = gemma_server.post("/tokenize", json={"prompt": [1, 2, 3]})
    assert r.json()["tokens"] == [1, 2, 3] and r.json()["count"] == 3
    r = gemma_server.post("/tokenize", json={"prompt": "hello world"})
    assert r.json()["tokens"] == reference(MODEL).tokenizer.encode("hello world")
