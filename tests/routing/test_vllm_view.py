"""The router's view of a backend learned from vLLM-format events.

Round trip: a real hybridkv engine serves random prompts (shared prefixes,
salts, a small pool so blocks are evicted); its block events go two ways:
natively into the router (the layout the engine publishes, the tested
path) and through the vLLM-format publisher's conversion, msgpack bytes and
the decoder into a `VllmCacheView`. Both views must credit every probe
prompt with the same reusable tokens. Then hand-built vLLM events: a
sliding-window case the full-attention chain alone routes wrong, and Mamba.
"""

from __future__ import annotations

import random

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.serving.kv_events_wire import (
    WireBatch,
    WireBlockRemoved,
    WireBlockStored,
    decode_batch,
    encode_batch,
)
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.routing import Router
from hybridkv.serving.router.vllm_view import VllmCacheView
from hybridkv.serving.zmq_publisher import KvEventsConfig, ZmqKvEventPublisher


def serve_and_collect(llm: LLM, prompts: list[tuple[list[int], str | None]]):
    """Run the prompts one step at a time; (native events, wire payloads) per step."""
    publisher = ZmqKvEventPublisher(KvEventsConfig(True, "zmq"), llm.kv,
                                    running=lambda: llm.scheduler.running)
    native: list = []
    llm.kv.subscribe(native.append)
    steps = []
    for i, (prompt, salt) in enumerate(prompts):
        seq = llm.add_request({"prompt_token_ids": prompt, "cache_salt": salt},
                              SamplingParams(max_tokens=3), request_id=f"r{i}")
        publisher.note_request(seq.request)
        while llm.has_unfinished_requests():
            llm.step()
            events = native[:]
            native.clear()
            wire = publisher.to_wire(events)
            steps.append((events, encode_batch(WireBatch(0.0, wire))))
    assert publisher.num_unknown == 0
    return steps


def workload(rng: random.Random, n: int) -> list[tuple[list[int], str | None]]:
    docs = [[rng.randrange(3, 500) for _ in range(rng.randrange(40, 140))] for _ in range(4)]
    out = []
    for _ in range(n):
        doc = rng.choice(docs)
        cut = rng.randrange(16, len(doc) + 1)
        tail = [rng.randrange(3, 500) for _ in range(rng.randrange(1, 30))]
        out.append((doc[:cut] + tail, rng.choice([None, None, "s1"])))
    return out


@pytest.mark.parametrize("preset", ["gemma3-tiny", "jamba-tiny"])
def test_wire_view_credits_what_the_native_view_credits(preset):
    rng = random.Random(7)
    llm = LLM(preset, num_blocks=48)
    prompts = workload(rng, 14)
    steps = serve_and_collect(llm, prompts)
    native, wired = Router("hybrid-prefix"), Router("hybrid-prefix")
    native.add_backend("b", CacheLayout.from_config(llm.kv.config, llm.kv.hash_algo))
    view = VllmCacheView("b", wired)
    probes = [p for p, _ in workload(random.Random(8), 30)] + [p for p, _ in prompts]
    checked = 0
    for events, payload in steps:
        native.apply_events("b", events)
        view.apply(decode_batch(payload))
        for probe in rng.sample(probes, 4):
            for salt in (None, "s1"):
                want = native.explain(probe, cache_salt=salt)["backends"]["b"]
                got = wired.explain(probe, cache_salt=salt)["backends"]["b"]
                assert got["reusable_tokens"] == want["reusable_tokens"], (probe, salt)
                checked += want["reusable_tokens"] > 0
    assert view.num_unplaced == 0
    assert checked > 10  # the probes did hit cached prefixes


def stored(hashes, parent, tokens, group, kind, window=None, bs=16, keys=None):
    return WireBlockStored(hashes, parent, tokens, bs, None, "GPU", None, keys, group, kind,
                           window)


def blocks(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(16 * n)]


def test_window_case_where_the_chain_alone_routes_wrong():
    """Full + sliding window (W=32, two 16-token blocks). Backend a caches all 8
    full blocks but only window blocks 0-1; b caches 6 full blocks and window
    blocks 4-5. The chain says a (128 tokens); only b can reuse anything long:
    a's hit stops at 2 blocks (32 tokens), b's at 6 (96)."""
    prompt = blocks(8) + [7]
    hashes = list(range(100, 108))  # vLLM's opaque hashes, one per block
    router = Router("hybrid-prefix")
    a, b = VllmCacheView("http://a", router), VllmCacheView("http://b", router)
    a.apply(WireBatch(0.0, [
        stored(hashes, None, prompt[:128], 0, "full_attention"),
        stored(hashes[:2], None, prompt[:32], 1, "sliding_window", 32)]))
    b.apply(WireBatch(0.0, [
        stored(hashes[:6], None, prompt[:96], 0, "full_attention"),
        stored(hashes[4:6], None, prompt[:96], 1, "sliding_window", 32)]))
    explained = router.explain(prompt)
    per = explained["backends"]
    assert (per["http://a"]["chain_tokens"], per["http://b"]["chain_tokens"]) == (128, 96)
    assert (per["http://a"]["reusable_tokens"], per["http://b"]["reusable_tokens"]) == (32, 96)
    assert router.route(prompt).instance_id == "http://b"
    chain_only = Router("prefix")
    for url, view in (("http://a", a), ("http://b", b)):
        chain_only.add_backend(url, view.layout)
        chain_only.apply_events(url, view._store_events(0, view.held[0]))
    assert chain_only.route(prompt).instance_id == "http://a"


def test_removal_and_mamba_state_rule():
    """A Mamba group is credited only where its state at the stop is cached."""
    prompt = blocks(4, seed=1) + [9]
    router = Router("hybrid-prefix")
    view = VllmCacheView("http://m", router)
    view.apply(WireBatch(0.0, [
        stored([1, 2, 3, 4], None, prompt[:64], 0, "full_attention"),
        stored([3, 4], None, prompt[:64], 1, "mamba"),  # states at blocks 2 and 3 only
    ]))
    assert view.num_unplaced == 0
    assert router.explain(prompt)["backends"]["http://m"]["reusable_tokens"] == 64
    view.apply(WireBatch(0.0, [WireBlockRemoved([4], "GPU", 1)]))
    assert router.explain(prompt)["backends"]["http://m"]["reusable_tokens"] == 48
    view.apply(WireBatch(0.0, [WireBlockRemoved([2, 3], "GPU", 0)]))
    assert router.explain(prompt)["backends"]["http://m"]["reusable_tokens"] == 0


def test_unknown_parent_is_counted_not_guessed():
    router = Router("hybrid-prefix")
    view = VllmCacheView("http://x", router)
    view.apply(WireBatch(0.0, [stored([5], 999, blocks(1), 0, "full_attention")]))
    assert view.num_unplaced == 1 and view.num_blocks() == 0
