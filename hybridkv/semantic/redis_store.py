"""`redis://host:port/db`: entries shared by every instance on one plain Redis
(no query engine needed).

Layout under `hybridkv:semantic:`: `e:<id>` the entry's JSON with the TTL as
its expiry; `lru` a sorted set of ids by last use (the size bound evicts its
oldest); `adds` a stream of additions (id, scope, key, vector). Every
instance follows `adds` from a thread and keeps its own ANN index current, so
the search is in process and only a candidate's answer is read from Redis.
An entry that expired or was evicted is dropped from the local index when its
`GET` comes back empty.

Redis being down, slow or returning damaged data costs a miss (and a warning
once per outage), never a failed request: calls carry a short timeout, and
after a failure the store answers "nothing" without calling Redis for
`RETRY_SECONDS`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from hybridkv.semantic.entry import Entry
from hybridkv.semantic.scoped_index import ScopedIndex

logger = logging.getLogger("hybridkv.semantic")
PREFIX = "hybridkv:semantic:"
SOCKET_TIMEOUT = 0.25
RETRY_SECONDS = 1.0
READ_BLOCK_MS = 200


class RedisStore:
    """Same surface as `MemoryStore`; `num_errors` counts failed Redis calls."""

    def __init__(self, url: str, dim: int, *, max_entries: int, ttl_seconds: float) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT,
                                           socket_connect_timeout=SOCKET_TIMEOUT)
        self._errors = (redis.RedisError, OSError, ValueError, KeyError)
        self.dim, self.max_entries, self.ttl_seconds = dim, max_entries, ttl_seconds
        self.index = ScopedIndex(dim)
        self.lock = threading.Lock()
        self.num_evictions = self.num_errors = 0
        self._down_until = 0.0
        self._healthy = True
        self._last_id = b"0"
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._follow, name="semantic-redis", daemon=True)
        self._reader.start()

    def __len__(self) -> int:
        return len(self.index)

    # ---- the surface ---------------------------------------------------------

    def put(self, entry: Entry) -> None:
        """Write the entry, announce it on the stream, evict past the bound."""
        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            pipe.set(PREFIX + f"e:{entry.id}", entry.to_json(), ex=max(1, int(self.ttl_seconds)))
            pipe.zadd(PREFIX + "lru", {str(entry.id): time.time()})
            pipe.xadd(PREFIX + "adds", {"id": entry.id, "scope": entry.scope, "key": entry.key,
                                        "vec": entry.vector.astype(np.float32).tobytes()},
                      maxlen=2 * self.max_entries, approximate=True)
            pipe.zcard(PREFIX + "lru")
            size = pipe.execute()[-1]
            if size > self.max_entries:
                self._evict(size - self.max_entries)

        self._call(write)
        with self.lock:
            self.index.add(entry.id, entry.scope, entry.key, entry.vector)

    def get(self, entry_id: int) -> Entry | None:
        """The live entry (its last use refreshed), or None: gone, damaged or Redis down."""
        def read() -> Entry | None:
            raw = self.client.get(PREFIX + f"e:{entry_id}")
            if raw is None:
                with self.lock:
                    self.index.remove(entry_id)
                return None
            self.client.zadd(PREFIX + "lru", {str(entry_id): time.time()})
            return Entry.from_json(raw, np.zeros(0, np.float32))

        return self._call(read)

    def exact(self, scope: str, key: str) -> int | None:
        with self.lock:
            return self.index.exact(scope, key)

    def search(self, scope: str, vector: np.ndarray, count: int) -> list[tuple[int, float]]:
        with self.lock:
            return self.index.search(scope, vector, count)

    def close(self) -> None:
        self._stop.set()
        self._reader.join(timeout=2 * SOCKET_TIMEOUT + READ_BLOCK_MS / 1000)
        self.client.close()

    # ---- internals -----------------------------------------------------------

    def _evict(self, count: int) -> None:
        oldest: Any = self.client.zpopmin(PREFIX + "lru", count)
        if oldest:
            self.client.delete(*(PREFIX + f"e:{member.decode()}" for member, _ in oldest))
            self.num_evictions += len(oldest)
            with self.lock:
                for member, _ in oldest:
                    self.index.remove(int(member))

    def _call(self, work):
        """`work()`, or None when Redis is (recently) down."""
        if time.monotonic() < self._down_until:
            return None
        try:
            result = work()
        except self._errors as err:
            self.num_errors += 1
            if self._healthy:
                logger.warning("semantic cache: Redis call failed (%s); answering misses", err)
            self._healthy = False
            self._down_until = time.monotonic() + RETRY_SECONDS
            return None
        self._healthy = True
        return result

    def _follow(self) -> None:
        """Apply the additions stream to the local index until `close`."""
        while not self._stop.is_set():
            try:
                found: Any = self.client.xread({PREFIX + "adds": self._last_id}, count=512,
                                          block=READ_BLOCK_MS)
            except self._errors:
                self._stop.wait(RETRY_SECONDS)
                continue
            for _, messages in found or []:
                for message_id, fields in messages:
                    self._apply(fields)
                    self._last_id = message_id

    def _apply(self, fields: dict[bytes, bytes]) -> None:
        try:
            vector = np.frombuffer(fields[b"vec"], np.float32)
            entry_id = int(fields[b"id"])
            if vector.shape != (self.dim,):
                return
            with self.lock:
                if entry_id not in self.index:
                    self.index.add(entry_id, fields[b"scope"].decode(), fields[b"key"].decode(),
                                   vector)
        except (KeyError, ValueError, UnicodeDecodeError):
            logger.warning("semantic cache: skipped a damaged stream record")
