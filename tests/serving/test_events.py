"""--events: block events reach a real redis-server in the shared wire format, the
instance's layout is written beside them, and a Redis that is down fails no request."""

import json
import time

import pytest
import redis
from redis_fixture import free_port, running_redis
from server_process import serve

from hybridkv import compute_block_hashes
from hybridkv.kv_cache.event_codec import decode_events
from hybridkv.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored

MODEL = "gemma3-tiny"
FULL_GROUP = 3  # gemma3-tiny: groups 0-2 slide, group 3 is full attention


def _events(client, stream):
    return [decode_events(fields[b"m"]) for _, fields in client.xrange(stream)]


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.fixture(scope="module")
def events_server(server_logs, redis_server):
    server = serve(MODEL, "--events", redis_server, "--instance-id", "node-a",
                   log_dir=server_logs)
    yield server
    assert server.stop() == 0


def test_block_events_are_published_per_step(events_server, redis_server):
    client = redis.Redis.from_url(redis_server)
    prompt = list(range(10, 110))  # 6 full blocks of 16
    out = events_server.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2,
                                                      "temperature": 0}).json()
    assert out["usage"]["completion_tokens"] == 2
    expected = set(compute_block_hashes(prompt, 16, hash_algo="sha256"))

    def stored_full():
        batches = _events(client, "hybridkv:events:node-a")
        return {e.block_hash for b in batches for e in b
                if isinstance(e, BlockStored) and e.group_id == FULL_GROUP}

    assert expected <= _wait_for(lambda: expected <= stored_full() and stored_full())
    batches = _events(client, "hybridkv:events:node-a")
    assert batches[0] == [AllBlocksCleared()], "a fresh instance starts from an empty cache"
    assert all(b for b in batches), "no empty batches are published"
    kinds = {type(e) for b in batches for e in b}
    assert kinds <= {AllBlocksCleared, BlockStored, BlockRemoved}
    assert events_server.metrics()["hybridkv_events_published_total"] == len(batches)


def test_instance_key_holds_the_layout_and_url(events_server, redis_server):
    client = redis.Redis.from_url(redis_server)
    stored = json.loads(client.get("hybridkv:instance:node-a"))
    layout = events_server.get("/v1/kv_cache_layout").json()
    assert stored == {**layout, "url": events_server.url}
    assert layout["instance_id"] == "node-a"


def test_redis_down_fails_no_request_and_recovers(server_logs, tmp_path):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = serve(MODEL, "--events", url, "--instance-id", "node-b", log_dir=server_logs)
    try:
        for i in range(3):
            r = server.post("/v1/completions", json={"prompt": list(range(20 + i, 60)),
                                                     "max_tokens": 2})
            assert r.status_code == 200
        assert _wait_for(lambda: "cannot publish block events" in server.log_text(), 10)
        assert server.log_text().count("cannot publish block events") == 1  # warned once
        with running_redis(tmp_path, port) as live_url:
            client = redis.Redis.from_url(live_url)
            r = server.post("/v1/completions", json={"prompt": list(range(200, 300)),
                                                     "max_tokens": 2})
            assert r.status_code == 200
            batches = _wait_for(lambda: _events(client, "hybridkv:events:node-b"), 20)
            assert batches and batches[0][0] == AllBlocksCleared(), \
                "after lost batches the stream restarts from an empty view"
            assert client.get("hybridkv:instance:node-b") is not None
            assert server.stop() == 0
            assert client.get("hybridkv:instance:node-b") is None, "deleted on shutdown"
    finally:
        server.stop()
