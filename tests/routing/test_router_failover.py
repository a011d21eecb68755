"""A backend killed while the router has requests on it: every accepted request
completes (on another backend), the dead one leaves rotation, and it returns
once it answers again."""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest

pytest.importorskip("hybridkv.serving.server", reason="needs `hybridkv serve` in this build")
import httpx  # noqa: E402
from http_helpers import route, start_backend, wait_until  # noqa: E402

MODEL = "gemma3-tiny"


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("failover-logs")


def test_killed_backend_loses_no_accepted_request(redis_server, logs):
    backends = [start_backend(MODEL, name, redis_server, logs, wait=False) for name in "XYZ"]
    router = None
    try:
        for proc in backends:
            proc.wait_healthy()
        router = route(backends, redis_server, logs, "hybrid-prefix")
        rng = random.Random(0)
        prompts = [[rng.randrange(3, 250) for _ in range(rng.randint(20, 90))]
                   for _ in range(30)]
        results: list = [None] * len(prompts)

        def send(i: int) -> None:
            try:
                reply = router.client().completions.create(
                    model=MODEL, prompt=prompts[i], max_tokens=120, temperature=0,
                    extra_body={"ignore_eos": True}, stream=(i % 3 == 0))
                if i % 3 == 0:
                    reply = [chunk for chunk in reply][-1]
                results[i] = reply.choices[0].finish_reason
            except Exception as err:  # recorded: the assertion below names it
                results[i] = err

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        victim = backends[0]
        wait_until(lambda: router.metrics().get(
            "hybridkv_router_in_flight{backend=X}", 0) > 0, what="requests on X")
        time.sleep(0.2)
        victim.stop(signal.SIGKILL)
        for thread in threads:
            thread.join(120)
        # streams that already sent data when X died end with an error event; every
        # other request (not started, or not streamed) is retried and completes
        finished = [r for r in results if r == "length"]
        failed = [(i, r) for i, r in enumerate(results) if r != "length"]
        assert all(i % 3 == 0 for i, _ in failed), failed
        assert len(finished) >= 20
        metrics = router.metrics()
        assert metrics["hybridkv_router_backend_healthy{backend=X}"] == 0
        assert metrics["hybridkv_router_retries_total"] >= 1
        reply = router.client().completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=2)
        assert reply.choices[0].finish_reason is not None  # served by Y or Z

        revived = start_backend(MODEL, "X", redis_server, logs, port=victim.port)
        backends[0] = revived
        wait_until(lambda: router.metrics()["hybridkv_router_backend_healthy{backend=X}"] == 1,
                   what="X back in rotation")
        assert httpx.get(f"{router.url}/health", timeout=5).status_code == 200
    finally:
        if router is not None:
            router.stop()
        for proc in backends:
            proc.stop()


def test_redis_killed_and_restarted_under_a_running_router(killable_redis, logs):
    """The event Redis dies and comes back (empty) while a backend and the router
    run: requests keep being served, the router's reader retries, rebuilds its
    view from the new stream and sees the documents computed after the restart."""
    url = killable_redis.url
    backend = start_backend(MODEL, "E", url, logs)
    router = None
    try:
        router = route([backend], url, logs, "hybrid-prefix")
        rng = random.Random(3)
        docs = [[rng.randrange(3, 250) for _ in range(64)] for _ in range(3)]

        def reusable(doc: list[int]) -> int:
            reply = httpx.post(f"{router.url}/route/explain", timeout=30,
                               json={"model": MODEL, "prompt": doc + [7]})
            return reply.json()["backends"]["E"]["reusable_tokens"]

        def send(doc: list[int]) -> None:
            out = router.client().completions.create(model=MODEL, prompt=doc, max_tokens=1)
            assert out.choices[0].finish_reason is not None

        send(docs[0])
        wait_until(lambda: reusable(docs[0]) == 64, what="the first document's events")
        killable_redis.kill()
        send(docs[1])  # served while Redis is down (its events are lost)
        wait_until(lambda: router.metrics()["hybridkv_router_event_read_failures_total"] >= 1,
                   what="a failed read")
        killable_redis.start()
        send(docs[2])  # the backend reconnects, starts its new stream with a clear
        wait_until(lambda: reusable(docs[2]) == 64, timeout=30,
                   what="the document computed after the restart")
        metrics = router.metrics()
        assert metrics["hybridkv_router_event_rebuilds_total"] >= 1
        assert reusable(docs[0]) == 0  # cleared with the view: never more than it holds
    finally:
        if router is not None:
            router.stop()
        backend.stop()
