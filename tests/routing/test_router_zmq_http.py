"""`hybridkv route --kv-event-source` over real processes: two `hybridkv serve
--kv-events-config` backends publish vLLM-format events on loopback; the
router learns their caches from those events only (no Redis) and sends a
document's follow-up where the document is cached."""

from __future__ import annotations

import json
import random

import httpx
from http_helpers import ServerProcess, serve, wait_until
from redis_fixture import free_port


def events_config(tmp_path, name: str) -> tuple[str, str, str]:
    pub, replay = f"ipc://{tmp_path}/{name}", f"tcp://127.0.0.1:{free_port()}"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": pub,
              "replay_endpoint": replay, "topic": "kv"}
    return json.dumps(config), pub, replay


def test_router_follows_zmq_events_of_hybridkv_backends(tmp_path):
    backends, sources = [], []
    router = None
    try:
        for name in ("a", "b"):
            config, pub, replay = events_config(tmp_path, name)
            backend = serve("gemma3-tiny", "--kv-events-config", config, log_dir=tmp_path,
                            wait=False)  # both start side by side
            backends.append(backend)
            sources += ["--kv-event-source", f"{backend.url}={pub}",
                        "--kv-event-replay-source", f"{backend.url}={replay}"]
        for backend in backends:
            backend.wait_healthy()
        argv = ["route", "--policy", "hybrid-prefix", "--check-interval", "0.3", *sources]
        for b in backends:
            argv += ["--backend", b.url]
        router = ServerProcess(argv, log_dir=tmp_path)
        rng = random.Random(5)
        doc = [rng.randrange(3, 500) for _ in range(120)]

        def send(prompt: list[int]) -> tuple[str, int]:
            raw = router.client().completions.with_raw_response.create(
                model="gemma3-tiny", prompt=prompt, max_tokens=1, temperature=0)
            return (raw.headers["x-hybridkv-backend"],
                    raw.parse().usage.prompt_tokens_details.cached_tokens)

        first, _ = send(doc + [7])
        assert first in {b.url for b in backends}  # a vLLM-style backend is named by URL

        def learned() -> bool:
            reply = httpx.post(f"{router.url}/route/explain", timeout=30,
                               json={"model": "gemma3-tiny", "prompt": doc + [9, 9]})
            return reply.json()["backends"][first]["reusable_tokens"] >= 112

        wait_until(learned, what="the router learning the document from ZMQ events")
        for tail in ([9, 9], [11, 12, 13]):
            backend, cached = send(doc + tail)
            assert backend == first and cached >= 112
    finally:
        for process in [*backends, *([router] if router else [])]:
            process.stop()
