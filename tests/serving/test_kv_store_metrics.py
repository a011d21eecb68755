"""`hybridkv serve --kv-store cpu://...`: a document pushed out of a small pool comes back
from the store, the HTTP usage counts it as cached, and /metrics (parsed by
prometheus-client) reports the store's hits, bytes, times and state per group, equal
to what an in-process engine with the same settings reports."""

import random
import warnings

import pytest
from server_process import serve

from hybridkv import LLM, SamplingParams
from hybridkv.store.payload import HEADER_BYTES

MODEL = "gemma3-tiny"
ARGS = ("--num-blocks", "40", "--kv-store", "cpu://?size=64MiB")


def prompts():
    """A document, three others that push it out of the 40-block pool, the document
    again with another question."""
    rng = random.Random(0)

    def toks(n):
        return [rng.randrange(3, 500) for _ in range(n)]

    doc = toks(120)
    return [doc + [7, 8], *[toks(120) + [9] for _ in range(3)], doc + [10, 11]]


@pytest.fixture(scope="module")
def store_server(server_logs):
    server = serve(MODEL, *ARGS, log_dir=server_logs)
    yield server
    assert server.stop() == 0, server.log_text()[-3000:]


@pytest.fixture(scope="module")
def expected():
    """The same requests through an in-process engine with the same pool and store."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = LLM(MODEL, num_blocks=40, kv_store="cpu://?size=64MiB")
        outs = [llm.generate([p], SamplingParams(max_tokens=4))[0] for p in prompts()]
        llm.flush_kv_store()
        stats = llm.kv_store_stats()
        llm.close()
    return outs, stats


def sample(metrics, name, group=None):
    return metrics[f"{name}{{group={group}}}" if group is not None else name]


def test_store_hits_reach_usage_and_metrics(store_server, expected):
    outs, stats = expected
    client = store_server.client()
    before = store_server.metrics()
    assert sample(before, "hybridkv_kv_store_up") == 1
    assert sample(before, "vllm:external_prefix_cache_hits_total") == 0
    for prompt, want in zip(prompts(), outs):
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                        temperature=0.0)
        assert got.choices[0].text is not None
        assert got.usage.prompt_tokens == len(prompt)
        assert got.usage.prompt_tokens_details.cached_tokens == want.num_cached_tokens
    assert outs[-1].num_external_cached_tokens > 0  # the document came from the store

    m = store_server.wait_idle()
    assert sample(m, "vllm:external_prefix_cache_hits_total") == stats.hit_tokens > 0
    assert sample(m, "vllm:external_prefix_cache_queries_total") == stats.queried_tokens > 0
    for g, group in enumerate(stats.groups):
        assert sample(m, "hybridkv_kv_store_hit_tokens_total", g) == group.loaded_tokens
        assert sample(m, "hybridkv_kv_store_loaded_blocks_total", g) == group.loaded_blocks
        assert sample(m, "hybridkv_kv_store_read_bytes_total", g) == group.read_bytes
        assert sample(m, "hybridkv_kv_store_rejected_blocks_total", g) == 0
        loaded = sample(m, "hybridkv_kv_store_load_seconds_total", g)
        assert (loaded > 0) == (group.loaded_blocks > 0)
    assert sum(g.loaded_tokens for g in stats.groups) > 0
    assert sample(m, "hybridkv_kv_store_dropped_blocks_total") == 0
    assert sample(m, "hybridkv_kv_store_errors_total") == 0


def test_written_blocks_and_store_size_are_reported(store_server, expected):
    _, stats = expected
    m = store_server.wait_idle()
    written = [sample(m, "hybridkv_kv_store_written_blocks_total", g)
               for g in range(len(stats.groups))]
    assert sum(written) > 0
    for g, n in enumerate(written):
        nbytes = sample(m, "hybridkv_kv_store_written_bytes_total", g)
        if n:  # each block: the header and the group's page in each of its layers
            assert nbytes % n == 0 and nbytes // n > HEADER_BYTES
            assert sample(m, "hybridkv_kv_store_store_seconds_total", g) > 0
    assert sample(m, "hybridkv_kv_store_keys") >= sum(written) - stats.dropped_blocks
    assert sample(m, "hybridkv_kv_store_used_bytes") > 0
