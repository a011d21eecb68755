"""Reads the backends' block events from Redis into the router's index.

Each backend publishes to the stream `hybridkv:events:<instance-id>` one
entry per engine step, field `m` = `encode_events(batch)`; a fresh backend's
first entry is `AllBlocksCleared`. The router reads each stream from its
start (XRANGE from 0, in pages), so a restarted router rebuilds its view,
then follows it (XREAD BLOCK). A message it cannot decode is logged and
skipped; a Redis that is down is retried every second (routing goes on with
the view it has).
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


def stream_key(instance_id: str) -> str:
    return STREAM_PREFIX + instance_id


class EventStreams:
    """One reader task per backend instance id, feeding `router`."""

    def __init__(self, url: str, router: Router) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.router = router
        self.redis = aioredis.Redis.from_url(url, socket_connect_timeout=2)
        self.tasks: dict[str, asyncio.Task] = {}
        self.last_id: dict[str, bytes] = {}
        self.num_batches = 0
        self.num_bad = 0

    def follow(self, instance_id: str) -> None:
        """Start reading the instance's stream (from its start) unless already."""
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
        self.last_id[instance_id] = b"0-0"
        while True:
            try:
                await self._replay(instance_id, key)
                while True:
                    reply: Any = await self.redis.xread({key: self.last_id[instance_id]},
                                                   count=PAGE, block=BLOCK_MS)
                    for _, entries in reply or ():
                        self._apply(instance_id, entries)
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as err:
                logger.warning("block events of %s: %s; retrying", instance_id, err)
                await asyncio.sleep(1.0)

    async def _replay(self, instance_id: str, key: str) -> None:
        """Everything in the stream after the last entry read (all of it at first)."""
        while True:
            start = self.last_id[instance_id]
            entries = await self.redis.xrange(key, min=f"({start.decode()}"
                                              if start != b"0-0" else "-", count=PAGE)
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
