"""Publishes the KV cache manager's block events to a Redis stream (`--events`).

Stream `hybridkv:events:<instance-id>`: one entry per engine step that
produced events, field `m` = `hybridkv.kv_cache.event_codec.encode_events`
of that step's events, trimmed to about `maxlen` entries. The first entry
of a run is `AllBlocksCleared` (a fresh instance holds nothing), and so is
the first entry after batches were dropped, so a consumer's view is never
more than what the instance holds. Key `hybridkv:instance:<instance-id>`:
the instance's KV cache layout JSON (`/v1/kv_cache_layout` plus `url`),
written at every (re)connection and deleted on a clean shutdown. It expires
`ttl_seconds` after the last heartbeat (the publisher rewrites it every
`heartbeat_seconds`), so an instance that dies or hangs leaves the registry
on its own.

The engine thread only appends to a bounded queue; a background thread does
the network I/O. A Redis that is down costs a warning (once) and retries,
never a failed request; batches beyond the queue are dropped and counted.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from hybridkv.kv_cache.event_codec import encode_events
from hybridkv.kv_cache.events import AllBlocksCleared, BlockEvent

logger = logging.getLogger("hybridkv.serving")

STREAM_PREFIX = "hybridkv:events:"
INSTANCE_PREFIX = "hybridkv:instance:"
DEFAULT_TTL_SECONDS = 30.0


def stream_key(instance_id: str) -> str:
    return STREAM_PREFIX + instance_id


def instance_key(instance_id: str) -> str:
    return INSTANCE_PREFIX + instance_id


class EventPublisher:
    """Background publisher of block event batches to one Redis server.

    Args:
        url: `redis://host:port/db`.
        instance_id: names the stream and the instance key.
        layout: the JSON-ready dict written to the instance key.
        on_published: called with (batches published, batches dropped).
        max_pending: batches queued before new ones are dropped.
        maxlen: approximate length the stream is trimmed to.
        ttl_seconds: the instance key expires this long after the last heartbeat.
        heartbeat_seconds: how often the instance key is rewritten.
    """

    def __init__(self, url: str, instance_id: str, layout: dict[str, Any], *,
                 on_published: Callable[[int, int], None] | None = None,
                 max_pending: int = 4096, maxlen: int = 100_000,
                 retry_seconds: float = 1.0, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 heartbeat_seconds: float | None = None) -> None:
        if not ttl_seconds > 0:
            raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds!r}")
        import redis  # imported here: only servers started with --events need it

        self._redis = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.url = url
        self.stream = stream_key(instance_id)
        self.key = instance_key(instance_id)
        self.layout_json = json.dumps(layout)
        self._queue: queue.Queue[list[BlockEvent] | None] = queue.Queue(max_pending)
        self._on_published = on_published or (lambda published, dropped: None)
        self._maxlen = maxlen
        self._retry = retry_seconds
        self._ttl_ms = max(1, int(ttl_seconds * 1000))
        self._heartbeat = ttl_seconds / 3 if heartbeat_seconds is None else heartbeat_seconds
        self._next_beat = 0.0
        self._stop = threading.Event()
        self._reset_next_batch = False  # engine side: batches were dropped at the queue
        self._reset_next_send = False  # publisher side: batches were lost in a failed send
        self._connected = False
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="hybridkv-events", daemon=True)
        self.publish([AllBlocksCleared()])

    def start(self) -> None:
        self._thread.start()

    def publish(self, events: Sequence[BlockEvent]) -> None:
        """Queue one batch (one step's events, in order); never blocks.

        Call from one thread (the engine's). When the queue is full the batch
        is dropped and the next one accepted starts with AllBlocksCleared.
        """
        batch = list(events)
        if self._reset_next_batch:
            batch.insert(0, AllBlocksCleared())
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._reset_next_batch = True
            self._on_published(0, 1)
            return
        self._reset_next_batch = False

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is queued (within `timeout`), delete the instance key, stop."""
        self._stop.set()
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self._connected:
            try:
                self._redis.delete(self.key)
            except self._errors:
                pass
        self._redis.close()

    # ---- background thread ---------------------------------------------------

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batches, stopping = self._take()
            if batches and not self._send(batches):
                self._on_published(0, len(batches))
                self._reset_next_send = True
                if stopping or self._stop.wait(self._retry):
                    return

    def _take(self) -> tuple[list[list[BlockEvent]], bool]:
        """Block for one batch (or until the next heartbeat is due), then take
        every batch already queued."""
        while True:
            try:
                first = self._queue.get(timeout=max(0.0, self._next_beat - time.monotonic()))
                break
            except queue.Empty:
                self._beat()
        if first is None:
            return [], True
        batches = [first]
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batches, False
            if item is None:
                return batches, True
            batches.append(item)

    def _send(self, batches: list[list[BlockEvent]]) -> bool:
        """XADD every batch in one round trip; False (after a warning) when Redis fails."""
        if self._reset_next_send:
            reset: list[BlockEvent] = [AllBlocksCleared()]
            batches = [reset, *batches]
        try:
            pipe = self._redis.pipeline(transaction=False)
            if not self._connected or time.monotonic() >= self._next_beat:
                pipe.set(self.key, self.layout_json, px=self._ttl_ms)
            for batch in batches:
                pipe.xadd(self.stream, {"m": encode_events(batch)}, maxlen=self._maxlen,
                          approximate=True)
            pipe.execute()
        except self._errors as err:
            self._note_failure(err)
            return False
        if not self._connected:
            logger.info("publishing block events to %s (stream %s)", self.url, self.stream)
        self._connected = True
        self._next_beat = time.monotonic() + self._heartbeat
        self._reset_next_send = False
        self._on_published(len(batches), 0)
        return True

    def _beat(self) -> None:
        """Rewrite the instance key with a fresh expiry (while connected; a failed
        send reconnects, which writes it)."""
        self._next_beat = time.monotonic() + self._heartbeat
        if not self._connected:
            return
        try:
            self._redis.set(self.key, self.layout_json, px=self._ttl_ms)
        except self._errors as err:
            self._note_failure(err)

    def _note_failure(self, err: BaseException) -> None:
        if self._connected or not self._warned:
            logger.warning("cannot publish block events to %s (%s); retrying every %.1fs, "
                           "requests are unaffected", self.url, err, self._retry)
            self._warned = True
        self._connected = False
