"""`hybridkv route` in front of three real `hybridkv serve` backends and a real
redis-server, driven with the official openai client.

Backend A runs gemma3-tiny (three sliding-window groups of window 32, one
full-attention group) on a pool of 69 blocks with LRU eviction, so that a
pressure request evicts its sliding-window blocks (freed first) while its
full-attention chain stays cached: A holds a document's chain but not the
windows a hit needs. B and C have ample pools.
"""

from __future__ import annotations

import json
import random

import httpx
import pytest

pytest.importorskip("hybridkv.serving.server", reason="needs `hybridkv serve` in this build")
from http_helpers import complete, route, start_backend, wait_idle, wait_until  # noqa: E402

MODEL = "gemma3-tiny"
BLOCK = 16
SALT = "tenant-secret-7f3a"


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("router-logs")


@pytest.fixture(scope="module")
def backends(redis_server, logs):
    procs = [start_backend(MODEL, "A", redis_server, logs, "--num-blocks", "69",
                           "--eviction-policy", "lru", wait=False),
             start_backend(MODEL, "B", redis_server, logs, wait=False),
             start_backend(MODEL, "C", redis_server, logs, wait=False)]
    for proc in procs:
        proc.wait_healthy()
    yield dict(zip("ABC", procs))
    for proc in procs:
        assert proc.stop() == 0, proc.log_text()[-3000:]


@pytest.fixture(scope="module")
def routers(backends, redis_server, logs):
    procs = {policy: route(list(backends.values()), redis_server, logs, policy)
             for policy in ("hybrid-prefix", "prefix", "round-robin")}
    yield procs
    for proc in procs.values():
        proc.stop()


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 250) for _ in range(n)]


def explain(router, prompt: list[int], **extra) -> dict:
    reply = httpx.post(f"{router.url}/route/explain", json={"model": MODEL, "prompt": prompt,
                                                            **extra}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def direct(backend, prompt: list[int], **extra) -> int:
    """A completion sent to one backend itself; its cached tokens."""
    reply = httpx.post(f"{backend.url}/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_hybrid_case_window_lost_on_a(backends, routers):
    """A caches the document's full-attention chain but lost its windows; B holds
    both: hybrid-prefix sends the next question to B, prefix to A (which then
    recomputes), and the backends' own cached_tokens agree."""
    rng = random.Random(0)
    doc, extra = tokens(rng, 8 * BLOCK), tokens(rng, 4 * BLOCK)
    direct(backends["A"], doc + extra)  # chain of 12 blocks, windows freed first (LRU)
    direct(backends["A"], tokens(rng, 10 * BLOCK))  # pressure: evicts A's window blocks
    direct(backends["B"], doc + tokens(rng, 2 * BLOCK))  # B: the document and its windows
    q_hybrid = doc + extra[:2 * BLOCK] + tokens(rng, 8)
    hybrid, prefix = routers["hybrid-prefix"], routers["prefix"]

    def caught_up() -> bool:
        view = explain(hybrid, q_hybrid)["backends"]
        return view["A"]["chain_tokens"] == 10 * BLOCK and view["B"]["reusable_tokens"] == 128
    wait_until(caught_up, what="the router's view of A and B")
    wait_idle(hybrid)
    view = explain(hybrid, q_hybrid)["backends"]
    assert view["A"]["reusable_tokens"] < view["B"]["reusable_tokens"] == 8 * BLOCK
    assert view["B"]["chain_tokens"] == 8 * BLOCK < view["A"]["chain_tokens"]

    backend, cached = complete(hybrid, q_hybrid)
    assert (backend, cached) == ("B", 8 * BLOCK)

    # a question further along A's chain: the prefix router still sees A's longer chain
    q_prefix = doc + extra[:3 * BLOCK] + tokens(rng, 8)
    wait_until(lambda: explain(prefix, q_prefix)["backends"]["B"]["chain_tokens"]
               == 10 * BLOCK, what="B's new chain in the prefix router")
    assert explain(prefix, q_prefix)["backend"] == "A"
    backend, cached = complete(prefix, q_prefix)
    assert backend == "A" and cached < 8 * BLOCK  # it recomputes what B could have reused


def test_repeated_documents_land_on_the_backend_holding_them(routers):
    """Each document asked twice: through hybrid-prefix the repeat goes where the
    document is cached (cached_tokens > 0); round-robin caches less in total."""
    rng = random.Random(1)
    totals = {}
    for policy in ("hybrid-prefix", "round-robin"):
        router, total = routers[policy], 0
        for _ in range(3):
            doc = tokens(rng, 5 * BLOCK)
            first, _ = complete(router, doc + tokens(rng, 8))
            wait_until(lambda d=doc, f=first: explain(routers["hybrid-prefix"], d + [5])["backends"]
                       [f]["chain_tokens"] >= 4 * BLOCK, what="the first copy's events")
            wait_idle(router)
            second, cached = complete(router, doc + tokens(rng, 8))
            total += cached
            if policy == "hybrid-prefix":
                assert second == first and cached == 5 * BLOCK
        totals[policy] = total
    assert totals["hybrid-prefix"] > totals["round-robin"]


def test_streams_pass_through_and_metrics_count_per_backend(routers):
    router = routers["hybrid-prefix"]
    stream = router.client().completions.create(model=MODEL, prompt=list(range(3, 40)),
                                                max_tokens=5, temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    assert len(chunks) >= 2  # several events, passed through as they came
    assert chunks[-1].choices[0].finish_reason == "length"
    metrics = router.metrics()
    routed = {k: v for k, v in metrics.items() if k.startswith("hybridkv_router_routed_total")}
    assert sum(routed.values()) >= 1
    assert all(metrics[f"hybridkv_router_backend_healthy{{backend={b}}}"] == 1 for b in "ABC")
    assert sum(v for k, v in metrics.items()
               if k.startswith("hybridkv_router_routed_cached_tokens_total")) > 0


def test_events_never_carry_the_salt(routers, backends, redis_server):
    """Salted requests: the streams hold hashes and group ids only, and a salted
    prompt does not match the same prompt's unsalted blocks."""
    import redis

    rng = random.Random(2)
    doc = tokens(rng, 4 * BLOCK)
    complete(routers["hybrid-prefix"], doc + [7], extra_body={"cache_salt": SALT})
    complete(routers["hybrid-prefix"], doc + [8], extra_body={"cache_salt": SALT})
    client = redis.Redis.from_url(redis_server)
    for key in client.scan_iter("hybridkv:events:*"):
        for _, fields in client.xrange(key):
            raw = fields[b"m"]
            assert SALT.encode() not in raw and SALT.encode().hex().encode() not in raw
            for row in json.loads(raw)["events"]:
                assert row[0] in ("S", "R", "C") and len(row) in (1, 3)
    view = explain(routers["hybrid-prefix"], doc + [9])["backends"]
    assert all(b["chain_tokens"] == 0 for b in view.values())  # unsalted: nothing matches
    salted = explain(routers["hybrid-prefix"], doc + [9], cache_salt=SALT)["backends"]
    assert max(b["chain_tokens"] for b in salted.values()) == 4 * BLOCK


def test_restarted_router_rebuilds_its_view_from_the_streams(backends, redis_server, logs,
                                                             routers):
    """A new router process reads every stream from its start: the same view."""
    rng = random.Random(3)
    doc = tokens(rng, 6 * BLOCK)
    first, _ = complete(routers["hybrid-prefix"], doc + [11])
    fresh = route(list(backends.values()), redis_server, logs, "hybrid-prefix")
    try:
        def same_view() -> bool:
            old = explain(routers["hybrid-prefix"], doc + [12])["backends"]
            new = explain(fresh, doc + [12])["backends"]
            return all(old[b]["cached_blocks"] == new[b]["cached_blocks"] for b in "ABC") \
                and new[first]["chain_tokens"] == 6 * BLOCK
        wait_until(same_view, what="the restarted router's view")
        wait_idle(fresh)
        backend, cached = complete(fresh, doc + [13])
        assert backend == first and cached == 6 * BLOCK
    finally:
        fresh.stop()
