"""A shared Redis KV store behind the router (real processes on 127.0.0.1).

Two `hybridkv serve --kv-store redis://...` backends with tiny pools share a
real redis-server; `hybridkv route --kv-store` counts what the store holds:
a document computed on A and evicted from A's pool (so written to the store)
is still counted for A, and for B too (which never computed it), but only
under the cache salt it was computed with. The backends' own `cached_tokens`
confirm the load.
"""

from __future__ import annotations

import random

import httpx
import pytest

pytest.importorskip("hybridkv.serving.server", reason="needs `hybridkv serve` in this build")
from http_helpers import complete, route, start_backend, wait_idle, wait_until  # noqa: E402

MODEL = "gemma3-tiny"  # 3 sliding-window groups (window 32) + 1 full-attention group
BLOCK = 16


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("store-logs")


@pytest.fixture(scope="module")
def cluster(redis_server, logs):
    """Backends A and B (40-block LRU pools, one store) and a hybrid-prefix router."""
    store = redis_server.rsplit("/", 1)[0] + "/1"  # the store in db 1, events in db 0
    procs = [start_backend(MODEL, name, redis_server, logs, "--num-blocks", "40",
                           "--eviction-policy", "lru", "--kv-store", store, wait=False)
             for name in "AB"]
    router = None
    try:
        for proc in procs:
            proc.wait_healthy()
        router = route(procs, redis_server, logs, "hybrid-prefix", "--kv-store", store)
        yield {"A": procs[0], "B": procs[1], "router": router, "store": store}
    finally:
        if router is not None:
            router.stop()
        for proc in procs:
            assert proc.stop() == 0, proc.log_text()[-3000:]


def explain(router, prompt: list[int], **extra) -> dict:
    reply = httpx.post(f"{router.url}/route/explain", timeout=30,
                       json={"model": MODEL, "prompt": prompt, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()["backends"]


def direct(backend, prompt: list[int], **extra) -> int:
    reply = httpx.post(f"{backend.url}/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 250) for _ in range(n)]


def test_layout_names_the_store_without_credentials(cluster):
    layout = httpx.get(f"{cluster['A'].url}/v1/kv_cache_layout", timeout=10).json()
    store = layout["kv_store"]
    assert store["url"] == cluster["store"] and store["prefix"] == "hkv"
    assert len(bytes.fromhex(store["fingerprint"])) == 16


def test_evicted_document_still_counted_through_the_store(cluster):
    rng = random.Random(7)
    doc = tokens(rng, 6 * BLOCK)
    router, a = cluster["router"], cluster["A"]
    assert direct(a, doc + tokens(rng, 5)) == 0
    question = doc + tokens(rng, 8)
    wait_until(lambda: explain(router, question)["A"]["reusable_tokens"] == 6 * BLOCK,
               what="A's events in the router")
    assert explain(router, question)["B"]["store_tokens"] == 0  # not in the store yet

    for _ in range(3):  # other documents through A's 40-block pool evict the first one
        direct(a, tokens(rng, 6 * BLOCK))

    def counted_from_store() -> bool:
        view = explain(router, question)
        return view["A"]["reusable_tokens"] == 0 and view["A"]["store_tokens"] == 6 * BLOCK
    wait_until(counted_from_store, timeout=30, what="the document evicted to the store")
    view = explain(router, question)
    assert view["B"]["reusable_tokens"] == 0 and view["B"]["store_tokens"] == 6 * BLOCK

    # another tenant's salt hashes to other keys: nothing in the store for it
    salted = explain(router, question, cache_salt="tenant-2")
    assert salted["A"]["store_tokens"] == salted["B"]["store_tokens"] == 0

    wait_idle(router)
    backend, cached = complete(router, question)
    assert cached == 6 * BLOCK, (backend, cached)  # loaded from the store, not recomputed
    metrics = router.metrics()
    assert metrics[f"hybridkv_router_routed_store_tokens_total{{backend={backend}}}"] \
        == 6 * BLOCK
    assert metrics["hybridkv_router_store_queries_total"] >= 4
    assert metrics["hybridkv_router_store_errors_total"] == 0


def test_store_weight_keeps_pool_hits_first(cluster):
    """A document in B's pool and in the store: B (pool) beats A (store only)."""
    rng = random.Random(8)
    doc = tokens(rng, 4 * BLOCK)
    router, a, b = cluster["router"], cluster["A"], cluster["B"]
    direct(a, doc + tokens(rng, 3))
    for _ in range(3):
        direct(a, tokens(rng, 6 * BLOCK))
    direct(b, doc + tokens(rng, 3))  # B computes it again (its pool had no copy)
    question = doc + tokens(rng, 8)

    def seen() -> bool:
        view = explain(router, question)
        return view["A"]["store_tokens"] == 4 * BLOCK and view["B"]["reusable_tokens"] == 64
    wait_until(seen, timeout=30, what="A's copy in the store and B's in its pool")
    wait_idle(router)
    backend, cached = complete(router, question)
    assert (backend, cached) == ("B", 4 * BLOCK)
