"""The router's block-event reader against a real redis-server that is killed,
restarted and trimmed while it reads (in process: `EventStreams` feeding a
`Router`, entries written with redis-py as `hybridkv serve` writes them).

- a connection that drops is retried (with back-off) and resumes after the
  last entry applied: nothing applied twice, nothing skipped;
- a stream that no longer holds that entry (trimmed past it, or recreated by
  a Redis restart) makes the reader rebuild the view from the stream's start,
  so the view never keeps blocks the backend may have dropped meanwhile.
"""

from __future__ import annotations

import asyncio
import time

import redis
from redis_fixture import RedisProcess

from hybridkv.kv_cache.event_codec import encode_events
from hybridkv.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored
from hybridkv.kv_cache.specs import FullAttentionSpec
from hybridkv.serving.router import CacheLayout
from hybridkv.serving.router.event_stream import EventStreams, stream_key
from hybridkv.serving.router.routing import Router

LAYOUT = CacheLayout((FullAttentionSpec(4),))
KEY = stream_key("a")


def stored(*ids: int) -> list:
    return [BlockStored(bytes([i]) * 32, 0, -1) for i in ids]


def publish(client: redis.Redis, events: list, maxlen: int | None = None) -> None:
    client.xadd(KEY, {"m": encode_events(events)}, maxlen=maxlen, approximate=False)


async def until(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_reader_survives_kill_restart_and_trimming(killable_redis):
    asyncio.run(_scenario(killable_redis))


async def _scenario(server: RedisProcess) -> None:
    router = Router()
    router.add_backend("a", LAYOUT)
    index = router.backends["a"].index
    client = redis.Redis(port=server.port)
    streams = EventStreams(server.url, router)
    try:
        publish(client, [AllBlocksCleared(), *stored(1, 2, 3)])
        streams.follow("a")
        await until(lambda: index.num_cached_blocks("a") == 3, "the first entries")

        # the reader's connection drops and comes back: it resumes after its last
        # entry (the removal and new block are applied once, nothing is replayed)
        assert client.client_kill_filter(_type="normal", skipme=True) >= 1
        publish(client, [BlockRemoved(bytes([1]) * 32, 0, -1), *stored(4)])
        await until(lambda: streams.num_batches == 2, "the entry after the drop")
        assert index.num_cached_blocks("a") == 3 and streams.num_rebuilds == 0

        # Redis is killed: reads fail and are retried with back-off
        server.kill()
        await until(lambda: streams.num_failures >= 2, "failed reads while Redis is down")
        await asyncio.sleep(0.3)
        failures = streams.num_failures
        await asyncio.sleep(0.5)
        assert streams.num_failures - failures <= 4, "retries back off"

        # restarted without persistence: the stream comes back without the entries the
        # reader had (and without the ones it may have missed): it rebuilds from the
        # new stream's start; blocks 2-4 are no longer counted
        server.start()
        client = redis.Redis(port=server.port)
        publish(client, stored(5))
        await until(lambda: streams.num_rebuilds == 1 and index.num_cached_blocks("a") == 1,
                    "the rebuild after the restart", timeout=30)
        assert index.table.get(bytes([5]) * 32) and not index.table.get(bytes([2]) * 32)

        # trimmed past the reader while it was away: rebuild from what is left
        streams.tasks["a"].cancel()
        await asyncio.sleep(0.05)
        for i in range(6, 10):
            publish(client, stored(i), maxlen=2)
        streams.follow("a")
        await until(lambda: streams.num_rebuilds == 2, "the rebuild after trimming")
        await until(lambda: index.num_cached_blocks("a") == 2, "the entries left")
        assert {h[0] for h in index.table} == {8, 9}

        # away but not trimmed past: resumes after its last entry, no rebuild
        streams.tasks["a"].cancel()
        await asyncio.sleep(0.05)
        batches = streams.num_batches
        publish(client, stored(10))
        publish(client, [BlockRemoved(bytes([8]) * 32, 0, -1)])
        streams.follow("a")
        await until(lambda: streams.num_batches == batches + 2, "the two new entries")
        assert streams.num_rebuilds == 2 and {h[0] for h in index.table} == {9, 10}
    finally:
        await streams.close()
        client.close()
