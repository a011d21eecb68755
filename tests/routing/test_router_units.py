"""The router without HTTP: layouts from JSON, bookkeeping, policies, bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored
from hybridkv.kv_cache.hashing import compute_block_hashes
from hybridkv.kv_cache.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from hybridkv.serving.router import CacheLayout, PrefixIndex
from hybridkv.serving.router.backends import load_from_metrics
from hybridkv.serving.router.policy import check_balance, check_policy
from hybridkv.serving.router.routing import NoBackendError, Router

LAYOUT = CacheLayout((FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=5)))


def stored(hashes, groups=(0, 1), start=0, end=None):
    return [BlockStored(h, g, -1) for h in hashes[start:end] for g in groups]


def test_layout_json_both_spellings_and_round_trip():
    serve_style = {"hash_algo": "xxhash", "groups": [
        {"group_id": 0, "type": "sliding_window", "block_size": 16, "sliding_window": 32,
         "num_sink_tokens": 0, "num_layers": 3},
        {"group_id": 1, "type": "full_attention", "block_size": 16, "num_layers": 1},
        {"type": "chunked_local_attention", "block_size": 16, "attention_chunk_size": 64},
        {"type": "sink_full_attention", "block_size": 16, "sink_len": 16},
        {"type": "mamba", "block_size": 16, "checkpoint_interval": 1}]}
    layout = CacheLayout.from_json(serve_style)
    assert layout.hash_algo == "xxhash" and len(layout.specs) == 5
    assert CacheLayout.from_json(layout.to_json()).key == layout.key
    classes, group_class = layout.reuse_classes()
    assert [c.kind for c in classes] == ["window", "chain", "chunk", "state"]
    assert group_class == [0, 1, 2, 1, 3]  # full and sink full share the chain rule


@pytest.mark.parametrize("body, named", [
    ({"groups": []}, "groups"),
    ({"groups": [{"type": "linear", "block_size": 16}]}, "unknown type 'linear'"),
    ({"groups": [{"type": "full"}]}, "groups[0]"),
    ({"groups": [{"type": "sliding_window", "block_size": 16}]}, "sliding_window"),
    ({"groups": [{"type": "full", "block_size": 16}], "hash_algo": "md5"}, "md5"),
    ([], "JSON object"),
])
def test_bad_layouts_name_the_field(body, named):
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        CacheLayout.from_json(body)


def test_index_events_slots_and_clears():
    index = PrefixIndex(LAYOUT, width=1)  # one bit per field: the second instance widens it
    prompt = list(range(3, 20))  # 17 tokens: 4 blocks, a hit of at most 16
    hashes = compute_block_hashes(prompt, 4)
    index.add_instance("a")
    index.add_instance("b")
    index.apply_events("a", stored(hashes))
    index.apply_events("b", stored(hashes, groups=(0,)) + stored(hashes, (1,), 0, 2))
    reuse = index.lookup(hashes, len(prompt) - 1)
    # b: full chain of 16 but window blocks only 0-1: the window (1 block) allows 8
    assert (reuse.tokens(index.bit_of["a"]), reuse.tokens(index.bit_of["b"])) == (16, 8)
    assert index.chain_lookup(hashes, 16).tokens(index.bit_of["b"]) == 16
    index.apply_events("a", [BlockRemoved(hashes[1], 0, -1)])
    assert index.lookup(hashes, 16).tokens(index.bit_of["a"]) == 4  # the chain stops at 1
    index.apply_events("a", [BlockRemoved(b"unknown", 0, -1)])
    assert index.num_unknown_removals == 1
    index.apply_events("a", [AllBlocksCleared()])
    assert index.num_cached_blocks("a") == 0 and index.lookup(hashes, 16).tokens(0) == 0
    index.remove_instance("a")
    assert index.add_instance("c") == 0  # the free slot is reused, with nothing cached
    assert index.lookup(hashes, 16).tokens(0) == 0
    with pytest.raises(ValueError, match="group 5"):
        index.apply_events("b", [BlockStored(hashes[0], 5, -1)])
    with pytest.raises(KeyError, match="nope"):
        index.apply_events("nope", [])


def test_route_prefers_reuse_then_load_and_keeps_loads():
    router = Router("hybrid-prefix", balance=1.0)
    for name in ("a", "b"):
        router.add_backend(name, LAYOUT, "m")
    prompt = list(range(3, 43))  # 40 tokens
    hashes = compute_block_hashes(prompt, 4)
    router.apply_events("b", stored(hashes))
    first = router.route(prompt, model="m")
    assert (first.instance_id, first.cached_tokens, first.pending_tokens) == ("b", 36, 4)
    assert router.loads["b"].pending_tokens == 4 and router.loads["b"].in_flight == 1
    router.first_token(first)
    router.finished(first)
    router.finished(first)  # idempotent
    assert (router.loads["b"].pending_tokens, router.loads["b"].in_flight) == (0, 0)
    router.update_load("b", pending_tokens=100)  # b busy: 40 - 36 + 100 > 40 + 0 on a
    assert router.route(prompt).instance_id == "a"
    explained = router.explain(prompt)
    assert explained["backends"]["b"]["reusable_tokens"] == 36
    assert explained["backends"]["b"]["pending_tokens"] == 100


def test_prefix_ignores_windows_and_health_leaves_rotation():
    router = Router("prefix")
    for name in ("a", "b"):
        router.add_backend(name, LAYOUT)
    prompt = list(range(3, 43))
    hashes = compute_block_hashes(prompt, 4)
    router.apply_events("a", stored(hashes, (0,)))  # chain only, no window
    router.apply_events("b", stored(hashes, (0, 1), 0, 5))  # 20 tokens with windows
    assert router.route(prompt).instance_id == "a"
    router.set_healthy("a", False)
    assert router.route(prompt).instance_id == "b"
    router.set_healthy("b", False)
    with pytest.raises(NoBackendError):
        router.route(prompt)
    with pytest.raises(ValueError, match="token_ids"):
        router.route([])


def test_round_robin_and_ties_take_turns():
    for policy in ("round-robin", "hybrid-prefix", "least-loaded"):
        router = Router(policy)
        for name in "abc":
            router.add_backend(name, LAYOUT)
        picks = []
        for _ in range(6):
            decision = router.route([1, 2, 3])
            picks.append(decision.instance_id)
            router.finished(decision)
        assert sorted(picks) == sorted("abcabc"), (policy, picks)


def test_bad_policy_balance_and_metrics_text():
    with pytest.raises(ValueError, match="fastest"):
        check_policy("fastest")
    for bad in (-1, "x", True, float("nan")):
        with pytest.raises(ValueError, match="balance"):
            check_balance(bad)
    text = ("# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="m"} 3.0\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m"} 2.0\n')
    assert load_from_metrics(text) == (3, 2)
    assert load_from_metrics("") == (0, 0)


def test_load_scan_agrees_with_the_prometheus_parser():
    """The line scan of the two load gauges against prometheus_client's parser, on
    label values with spaces and braces, several label sets, look-alike names,
    timestamps and other families."""
    from prometheus_client.parser import text_string_to_metric_families

    text = ("# HELP vllm:num_requests_waiting Requests waiting.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="a b} c",engine="0"} 4.0\n'
            'vllm:num_requests_waiting{model_name="m",engine="1"} 1.0 1700000000000\n'
            "# TYPE vllm:num_requests_running gauge\n"
            "vllm:num_requests_running 2\n"
            "# TYPE vllm:num_requests_running_total counter\n"
            "vllm:num_requests_running_total 99.0\n"
            "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
            'vllm:num_requests_waiting_by_reason{reason="x"} 7.0\n'
            "# TYPE process_cpu_seconds_total counter\n"
            "process_cpu_seconds_total 12.5\n")
    want = {"vllm:num_requests_waiting": 0.0, "vllm:num_requests_running": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in want:
                want[sample.name] += sample.value
    assert load_from_metrics(text) == (int(want["vllm:num_requests_waiting"]),
                                       int(want["vllm:num_requests_running"])) == (5, 2)
    with pytest.raises(ValueError):
        load_from_metrics("vllm:num_requests_waiting{model_name=\"m\"} many\n")


def test_other_layouts_do_not_mix():
    router = Router()
    router.add_backend("a", LAYOUT, "m1")
    router.add_backend("b", CacheLayout((FullAttentionSpec(4), MambaSpec(4))), "m2")
    assert len(router.indexes) == 2
    assert router.route([1, 2, 3, 4, 5], model="m2").instance_id == "b"
    router.add_backend("a", CacheLayout((FullAttentionSpec(4),)), "m1")  # a new layout
    assert router.backends["a"].index.layout.specs == (FullAttentionSpec(4),)


def test_store_blocks_complete_a_pool_and_count_below_pool_hits():
    """A shared store's blocks count per group together with a backend's own pool,
    at STORE_WEIGHT of a pool hit."""
    from hybridkv.serving.router.routing import STORE_WEIGHT
    from hybridkv.serving.router.store_view import _merge

    layout = CacheLayout((FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=8),
                          SlidingWindowSpec(4, sliding_window=8)))  # one window class
    router = Router("hybrid-prefix")
    for name in "abc":
        router.add_backend(name, layout)
    index = router.backends["a"].index
    prompt = list(range(3, 20))  # 4 blocks, hits of at most 16 tokens
    hashes = compute_block_hashes(prompt, 4)
    # a: the chain and window group 1 in its pool; the store: window group 2, blocks 2-3
    router.apply_events("a", stored(hashes, (0,)) + stored(hashes, (1,), 2, 4))
    spots = [(g, j) for g in range(3) for j in range(4)]
    reply = b"".join(b"1" if g == 2 and j >= 2 else b"0" for g, j in spots)
    extra: dict[bytes, int] = {}
    _merge(extra, index, hashes, spots, reply, [("a", 0), ("b", 1), ("c", 2)])
    explained = router.explain(prompt, stored={index: extra})["backends"]
    assert explained["a"]["reusable_tokens"] == 0 and explained["a"]["store_tokens"] == 16
    assert explained["b"]["store_tokens"] == 0  # the store alone lacks group 1's windows
    decision = router.route(prompt, stored={index: extra})
    assert (decision.instance_id, decision.cached_tokens, decision.store_tokens) == ("a", 16, 16)
    assert decision.pending_tokens == 1  # loaded tokens are not computed
    router.finished(decision)

    # c holds everything in its pool: a pool hit beats the same tokens through the store
    router.apply_events("c", stored(hashes, (0, 1, 2)))
    assert router.route(prompt, stored={index: extra}).instance_id == "c"
    # ... unless c's load outweighs the store's discount
    router.update_load("c", pending_tokens=int(16 * (1 - STORE_WEIGHT) / router.balance) + 1)
    assert router.route(prompt, stored={index: extra}).instance_id == "a"


@settings(max_examples=40)
@given(st.lists(st.tuples(st.sampled_from(["route", "first", "finish", "poll"]),
                          st.integers(0, 4), st.integers(0, 9)), max_size=60))
def test_load_costs_follow_loads_and_the_average(ops):
    """The kept costs equal the documented formula over the loads, with an
    average of requests in hand within MEAN_SLACK of the true one, and each
    decision is the brute-force argmin over backends of (load - credit)."""
    from hybridkv.serving.router.policy import MEAN_SLACK, REQUEST_TOKENS, TIE

    router = Router("hybrid-prefix")
    names = "abcde"
    for name in names:
        router.add_backend(name, LAYOUT)
    prompt = list(range(3, 43))
    hashes = compute_block_hashes(prompt, 4)
    router.apply_events("c", stored(hashes))  # c reuses 36 tokens, the others nothing
    decisions = []
    for op, who, amount in ops:
        if op == "route":
            group = router._candidates(None, ())[0]
            loads = [router.loads[n] for n in names]
            mean = group.loads.mean
            expected = [router.balance * (ld.pending_tokens + REQUEST_TOKENS
                                          * max(0.0, ld.num_requests - mean))
                        + ld.in_flight * TIE - (36 if n == "c" else 0)
                        for n, ld in zip(names, loads)]
            decision = router.route(prompt)
            assert expected[names.index(decision.instance_id)] == min(expected)
            decisions.append(decision)
        elif op in ("first", "finish") and decisions:
            decision = decisions[who % len(decisions)]
            (router.first_token if op == "first" else router.finished)(decision)
        elif op == "poll":
            router.update_load(names[who], waiting=amount, running=amount // 2)
        group = router._candidates(None, ())[0]
        loads = [router.loads[n] for n in names]
        true_mean = sum(ld.num_requests for ld in loads) / len(loads)
        assert abs(group.loads.mean - true_mean) < MEAN_SLACK
        assert group.loads.costs == [
            router.balance * (ld.pending_tokens + REQUEST_TOKENS
                              * max(0.0, ld.num_requests - group.loads.mean))
            + ld.in_flight * TIE for ld in loads]
