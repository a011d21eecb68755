"""The benchmark workloads and the replay driver, against brute force and invariants.

Oracles: shapes checked token by token (each chat turn extends the previous
turn's whole sequence, every question starts with its header or document);
`reuse_stats` against a brute-force longest-common-prefix search over raw
token tuples; the replay's hit rate against `reuse_stats`' infinite-pool
ceiling on an ample pool, and against the closed form on the shared-prefix
trace; preemption under a tiny pool finishing every request without leaks.
"""

from __future__ import annotations

import pytest

from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.tools.bench_traces import (
    TokenStream,
    branching_fewshot,
    long_doc_qa,
    multi_turn_round_robin,
    shared_prefix_trace,
)
from hybridkv.tools.pressure import SETTINGS, run_setting
from hybridkv.tools.replay import ManagerAdapter, make_config, replay
from hybridkv.tools.traces import reuse_stats


def adapter_for(config, num_blocks, **kwargs):
    return ManagerAdapter(KVCacheManager(make_config(config, num_blocks, **kwargs)))

SMALL = {
    "multi_turn": lambda: multi_turn_round_robin(num_sessions=4, num_turns=3, system_len=40,
                                                 first_message=(60, 120), message=(10, 40)),
    "fewshot": lambda: branching_fewshot(num_requests=30, system_len=20,
                                         tree=((30, (20, 90)), (50, (70,)))),
    "long_doc": lambda: long_doc_qa(doc_lens=(300, 500), questions_per_doc=4, preamble_len=24),
}


def test_token_streams_are_fixed_and_independent():
    assert TokenStream(1, 2).tokens(5) == TokenStream(1, 2).tokens(5)
    assert TokenStream(1, 2).tokens(5) != TokenStream(1, 3).tokens(5)
    assert all(0 <= t < 100 for t in TokenStream(9).tokens(1000, vocab=100))


@pytest.mark.parametrize("name", list(SMALL))
def test_traces_are_deterministic(name):
    a, b = SMALL[name](), SMALL[name]()
    assert a == b and a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 16


def test_shared_prefix_requests_do_not_depend_on_the_count():
    few, many = shared_prefix_trace(3, 32, 8, 4), shared_prefix_trace(10, 32, 8, 4)
    assert few.requests == many.requests[:3]
    assert all(r.prompt[:32] == few.requests[0].prompt[:32]
               for r in many.requests)


def test_multi_turn_round_robin_extends_each_conversation():
    trace = SMALL["multi_turn"]()
    by_id = {r.request_id: r for r in trace.requests}
    assert [r.request_id for r in trace.requests[:4]] == [f"chat{s}-turn0" for s in range(4)]
    for s in range(4):
        for t in range(1, 3):
            before, now = by_id[f"chat{s}-turn{t - 1}"], by_id[f"chat{s}-turn{t}"]
            history = before.prompt + before.output
            assert now.prompt[:len(history)] == history
            assert 10 <= len(now.prompt) - len(history) <= 40


def test_questions_start_with_their_header_or_document():
    fewshot = SMALL["fewshot"]()
    lens = fewshot.params["header_lens"]
    assert lens == [20 + 30 + 20, 20 + 30 + 90, 20 + 50 + 70]
    headers = {}
    for r in fewshot.requests:
        h = int(r.request_id.split("-")[0][len("header"):])
        headers.setdefault(h, r.prompt[:lens[h]])
        assert r.prompt[:lens[h]] == headers[h]
    docs = SMALL["long_doc"]()
    assert sorted(r.request_id for r in docs.requests) == sorted(
        f"doc{d}-q{q}" for d in range(2) for q in range(4))
    for r in docs.requests:
        n = 24 + (300, 500)[int(r.request_id[3])]
        assert r.prompt[:n] == docs.requests[0].prompt[:24] + \
            next(x for x in docs.requests if x.request_id[:4] == r.request_id[:4]
                 ).prompt[24:n]


def _brute_reuse(trace, block_size=16):
    """Hit blocks per request: longest block-aligned prefix seen in an earlier sequence."""
    earlier, used, hits = [], set(), []
    for r in trace.requests:
        seq = r.prompt + r.output
        cap = (len(r.prompt) - 1) // block_size
        hit = 0
        while hit < cap and any(len(e) >= (hit + 1) * block_size and
                                e[:(hit + 1) * block_size] == seq[:(hit + 1) * block_size]
                                for e in earlier):
            hit += 1
        used.update(seq[:(k + 1) * block_size] for k in range(hit))
        hits.append(hit)
        earlier.append(seq)
    prompt = sum(len(r.prompt) for r in trace.requests)
    return len(used), sum(hits) * block_size / prompt


@pytest.mark.parametrize("name", list(SMALL))
def test_reuse_stats_match_brute_force(name):
    trace = SMALL[name]()
    stats = reuse_stats(trace)
    reusable, ceiling = _brute_reuse(trace)
    assert stats.reusable_blocks == reusable and stats.ceiling_hit_rate == pytest.approx(ceiling)
    assert 0 < stats.ceiling_hit_rate < 1


@pytest.mark.parametrize("name", list(SMALL))
def test_ample_full_attention_pool_reaches_the_ceiling(name):
    trace = SMALL[name]()
    adapter = adapter_for("full", 4096)
    res = replay(trace.requests, adapter, max_running=4, max_batched_tokens=8192)
    assert res.finished == len(trace.requests) and res.preemptions == 0
    assert res.hit_rate == pytest.approx(reuse_stats(trace).ceiling_hit_rate)
    assert adapter.num_free_blocks == 4095


def test_shared_prefix_hit_rate_has_its_closed_form():
    trace = shared_prefix_trace(num_requests=20, prefix_len=100, unique_len=30, decode_steps=5)
    for config in ("full", "swa", "mamba"):
        res = replay(trace.requests, adapter_for(config, 1024), max_running=8, timed=True)
        assert res.hit_rate == pytest.approx(19 * (100 // 16) * 16 / (20 * 130)), config
        assert res.calls["allocate_decode"] == 20 * 5 and res.calls["free"] == 20


@pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")  # a tiny pool on purpose
@pytest.mark.parametrize("config", ["full", "swa", "mamba"])
def test_tiny_pool_preempts_finishes_everything_and_leaks_nothing(config):
    # 8 unrelated prompts of 4 blocks growing to 8 while decoding, 4 at a time, 24 blocks
    trace = shared_prefix_trace(num_requests=8, prefix_len=64, unique_len=0, decode_steps=64,
                                num_prefixes=8)
    adapter = adapter_for(config, 24, window=32)
    res = replay(trace.requests, adapter, max_running=4, max_batched_tokens=64)
    assert res.finished == len(trace.requests)
    assert res.preemptions > 0
    assert adapter.num_free_blocks == 23


def test_a_request_larger_than_the_pool_is_refused():
    trace = shared_prefix_trace(num_requests=1, prefix_len=400, unique_len=0, decode_steps=1)
    # KVCacheManager refuses it at the allocation, naming the request (it could never be
    # served); a manager that only returned None would be stopped by the driver instead
    refused = r"req-0.*(does not fit|needs \d+ more blocks|never be served)"
    with pytest.raises(ValueError, match=refused):
        replay(trace.requests, adapter_for("full", 8))


def test_pressure_settings_run_quick_and_stay_below_the_ceiling():
    for name in SETTINGS:
        row = run_setting(name, "swa", policy="lru", quick=True)
        assert row["complete"] and row["leak_free"]
        assert 0 <= row["hit_rate"] <= row["ceiling_hit_rate"]
    with pytest.raises(ValueError, match="setting 'nope'"):
        run_setting("nope", "full")
    with pytest.raises(ValueError, match="config 'sideways'"):
        make_config("sideways", 16)
