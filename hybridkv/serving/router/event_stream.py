"""Reads the backends' block events from Redis into the router's index.

Each backend publishes to the stream `hybridkv:events:<instance-id>` one
entry per engine step, field `m` = `encode_events(batch)`; a fresh backend's
first entry is `AllBlocksCleared`. The router reads each stream from its
start (XRANGE from 0, in pages), so a restarted router rebuilds its view,
then follows it (XREAD BLOCK). A message it cannot decode is logged and
skipped.

A read that fails (Redis restarted, connection dropped, timeout) is retried
after a back-off delay (0.1 s doubling to 5 s, reset once a read succeeds;
one warning per outage) and resumes after the last entry applied, so no
entry is applied twice or skipped. Before resuming, and whenever a read
returns a full page (the reader lags), the reader checks that the stream
still holds that last entry: if not, entries it never read may be gone
(trimmed past it, or the stream was recreated by a Redis restart; Redis 7
does not say how far a stream was trimmed, so this also rebuilds when
exactly that entry was trimmed), so it rebuilds: the instance's view is
cleared and the stream read again from its start. A view rebuilt that way
may hold less than the instance (blocks stored in entries already trimmed),
never more. Routing goes on with the view it has meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hybridkv.kv_cache.event_codec import decode_events
from hybridkv.serving.router.routing import Router

logger = logging.getLogger("hybridkv.router")

STREAM_PREFIX = "hybridkv:events:"
PAGE = 1000  # entries per XRANGE / XREAD call
BLOCK_MS = 1000
RETRY_S = (0.1, 5.0)  # first and longest delay before a failed read is retried
START = b"0-0"


def stream_key(instance_id: str) -> str:
    return STREAM_PREFIX + instance_id


class EventStreams:
    """One reader task per backend instance id, feeding `router`."""

    def __init__(self, url: str, router: Router) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.router = router
        self.redis = aioredis.Redis.from_url(url, socket_connect_timeout=2,
                                             socket_timeout=BLOCK_MS / 1000 + 5)
        self.tasks: dict[str, asyncio.Task] = {}
        self.last_id: dict[str, bytes] = {}  # per instance: the last entry applied
        self.num_batches = 0
        self.num_bad = 0
        self.num_failures = 0  # reads that failed (and were retried)
        self.num_rebuilds = 0  # views cleared and read again (entries were lost)

    def follow(self, instance_id: str) -> None:
        """Start reading the instance's stream unless already (after the last entry
        applied; the first time from its start)."""
        task = self.tasks.get(instance_id)
        if task is None or task.done():
            self.tasks[instance_id] = asyncio.create_task(self._read(instance_id))

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        await self.redis.aclose()

    async def _read(self, instance_id: str) -> None:
        import redis

        key = stream_key(instance_id)
        delay = RETRY_S[0]
        while True:
            try:
                await self._resume(instance_id, key)
                await self._replay(instance_id, key)
                delay = RETRY_S[0]
                while True:
                    reply: Any = await self.redis.xread({key: self.last_id[instance_id]},
                                                        count=PAGE, block=BLOCK_MS)
                    for _, entries in reply or ():
                        self._apply(instance_id, entries)
                        if len(entries) >= PAGE:  # lagging: trimmed past the last entry?
                            await self._resume(instance_id, key)
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as err:
                self.num_failures += 1
                if delay == RETRY_S[0]:
                    logger.warning("block events of %s: %s; retrying with back-off",
                                   instance_id, err)
                await asyncio.sleep(delay)
                delay = min(2 * delay, RETRY_S[1])

    async def _resume(self, instance_id: str, key: str) -> None:
        """Rebuild the instance's view from the stream's start when the stream no
        longer holds the last entry applied: entries after it may be lost
        (trimmed, or the stream recreated by a Redis restart)."""
        last = self.last_id.setdefault(instance_id, START)
        if last == START or await self.redis.xrange(key, min=last, max=last, count=1):
            return  # entries are trimmed oldest first: all after `last` are there
        logger.warning("block events of %s: the stream no longer holds entry %s; rebuilding "
                       "the view from the stream's start", instance_id, last.decode())
        self.num_rebuilds += 1
        if instance_id in self.router.backends:
            self.router.clear_cache_view(instance_id)
        self.last_id[instance_id] = START

    async def _replay(self, instance_id: str, key: str) -> None:
        """Everything in the stream after the last entry read (all of it at first)."""
        while True:
            start = self.last_id[instance_id]
            entries = await self.redis.xrange(key, min=f"({start.decode()}"
                                              if start != START else "-", count=PAGE)
            if not entries:
                return
            self._apply(instance_id, entries)

    def _apply(self, instance_id: str, entries) -> None:
        if instance_id not in self.router.backends:
            return
        for entry_id, fields in entries:
            self.last_id[instance_id] = entry_id
            try:
                events = decode_events(fields[b"m"])
                self.router.apply_events(instance_id, events)
                self.num_batches += 1
            except (KeyError, ValueError) as err:
                self.num_bad += 1
                logger.warning("skipping a bad block event entry %s of %s: %s",
                               entry_id, instance_id, err)
