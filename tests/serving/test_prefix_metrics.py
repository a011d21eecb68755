"""`vllm:prefix_cache_queries` / `_hits` count each request once, at admission.

The oracle is what the requests themselves report: their prompt lengths and
`num_cached_tokens`. A pool too small for every prompt at once makes requests
wait for room, so the manager looks the waiting ones up at several steps; those
lookups must not be counted again.
"""

import random

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hybridkv import LLM, SamplingParams
from hybridkv.serving.metrics import ServerMetrics


def _counters(metrics: ServerMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("vllm:prefix_cache")}


def test_waiting_requests_are_counted_once_at_admission():
    llm = LLM("gemma3-tiny", num_blocks=72, block_size=16)
    metrics = ServerMetrics("gemma3-tiny", llm)
    rng = random.Random(0)
    shared = [rng.randrange(3, 512) for _ in range(64)]
    prompts = [shared + [rng.randrange(3, 512) for _ in range(40)] for _ in range(8)]
    lookups_before = llm.kv.prefix_cache_stats.queries
    outputs = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    metrics.record_engine(llm)
    got = _counters(metrics)

    lookups = llm.kv.prefix_cache_stats.queries - lookups_before
    assert lookups > sum(map(len, prompts)), "no request waited: the case is not exercised"
    assert got["vllm:prefix_cache_queries_total"] == sum(len(o.prompt_token_ids)
                                                         for o in outputs)
    assert got["vllm:prefix_cache_hits_total"] == sum(o.num_cached_tokens for o in outputs)
    assert 0 < got["vllm:prefix_cache_hits_total"] < got["vllm:prefix_cache_queries_total"]
