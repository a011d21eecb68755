"""Entry stores: LRU order and TTL against a plain model; Redis shared by two
instances, bounded, and a miss (never an exception) when down."""

import time

import numpy as np
import pytest
from redis_fixture import free_port
from server_process import wait_until

from hybridkv.semantic.cache import open_store
from hybridkv.semantic.entry import Entry
from hybridkv.semantic.memory_store import MemoryStore


def entry(i, scope="s", dim=8, created=None):
    vector = np.zeros(dim, np.float32)
    vector[i % dim] = 1.0
    return Entry(i, scope, f"q{i}", f"question {i}", vector, f"answer {i}",
                 created=time.time() if created is None else created)


def test_lru_bound_keeps_the_most_recently_used():
    store = MemoryStore(8, max_entries=3, ttl_seconds=100)
    model = []  # ids, least recently used first
    for step, (op, i) in enumerate([("put", 1), ("put", 2), ("put", 3), ("get", 1),
                                    ("put", 4), ("get", 2), ("get", 3), ("put", 5)]):
        if op == "put":
            store.put(entry(i))
            model.append(i)
            del model[:-3]
        else:
            got = store.get(i)
            assert (got is not None) == (i in model), step
            if i in model:
                model.remove(i)
                model.append(i)
        assert list(store.id_to_entry) == model
        assert len(store.index) == len(model)
    assert store.num_evictions == 2


def test_ttl_expires_entries():
    now = [1000.0]
    store = MemoryStore(8, max_entries=10, ttl_seconds=5, clock=lambda: now[0])
    store.put(entry(1, created=1000.0))
    assert store.get(1) is not None
    now[0] = 1006.0
    assert store.get(1) is None
    assert store.exact("s", "q1") is None and store.num_evictions == 1


def test_bad_urls_name_themselves():
    with pytest.raises(ValueError, match="ftp://x"):
        open_store("ftp://x", 8)
    with pytest.raises(ValueError, match="unknown option"):
        open_store("memory://?sizes=3", 8)
    with pytest.raises(ValueError, match="max_entries"):
        open_store("memory://?size=0", 8)


def test_redis_instances_share_and_bound_entries(redis_server):
    url = redis_server.rsplit("/", 1)[0] + "/8"
    import redis

    redis.Redis.from_url(url).flushdb()
    first = open_store(url + "?size=3", 8)
    second = open_store(url + "?size=3", 8)
    try:
        first.put(entry(1))
        wait_until(lambda: second.exact("s", "q1") == 1, timeout=5, what="the stream")
        assert second.get(1).answer == "answer 1"
        assert second.search("s", entry(1).vector, 1)[0][0] == 1
        for i in range(2, 6):
            second.put(entry(i))
        assert redis.Redis.from_url(url).zcard("hybridkv:semantic:lru") == 3
        assert first.get(1) is None  # evicted: gone for every instance
        assert first.exact("s", "q1") is None
    finally:
        first.close()
        second.close()


def test_redis_down_is_a_miss():
    store = open_store(f"redis://127.0.0.1:{free_port()}/0", 8)
    try:
        store.put(entry(1))  # nothing raised
        assert store.get(1) is None
        assert store.num_errors >= 1
    finally:
        store.close()
