"""`redis://host:port/db`: blocks in a Redis server, shared by every engine using it.

One Redis string per block under `prefix:key`. Every call is one round
trip: puts are pipelined SETs, reads an MGET, existence queries pipelined
EXISTS (in growing chunks for prefix queries, which usually stop early).
Redis bounds and evicts by itself: start it with `--maxmemory` and
`--maxmemory-policy allkeys-lru`; under `noeviction` a full server refuses
writes (StoreFull) and keeps serving reads.

Connection failures and timeouts (`timeout` seconds, also for connecting)
raise StoreError; redis-py reconnects on the next call, and the tier's
guard spaces those calls out while the server is down.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.store.base import KVStore, StoreError, StoreFull, StoreStats

# first chunk of a prefix query; each next chunk is 4x larger
PREFIX_CHUNK = 8


class RedisStore(KVStore):
    """Blocks in Redis database `db` at `host:port`, keys under `prefix`."""

    scheme = "redis"
    shared = True

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, db: int = 0, *,
                 timeout: float = 1.0, prefix: bytes = b"hkv",
                 username: str | None = None, password: str | None = None) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as e:  # pragma: no cover - redis is a dependency
            raise ValueError("redis:// needs the redis package (pip install redis)") from e
        self._errors = (redis.exceptions.RedisError, OSError)
        self._full = redis.exceptions.OutOfMemoryError
        self.host, self.port, self.db = host, port, db
        self.prefix = prefix + b":"
        # no retries inside redis-py: a failed call is a miss, the guard decides when to retry
        self.client = redis.Redis(host=host, port=port, db=db, username=username,
                                  password=password, socket_timeout=timeout,
                                  socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))

    def describe(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.db}"

    def _keys(self, keys: Sequence[bytes]) -> list[bytes]:
        prefix = self.prefix
        return [prefix + k for k in keys]

    def _run(self, fn, *args):
        try:
            return fn(*args)
        except self._full as e:
            raise StoreFull(str(e)) from None
        except self._errors as e:
            raise StoreError(f"{type(e).__name__}: {e}") from None

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
        if len(keys) != len(values):
            raise ValueError(f"put: {len(keys)} keys but {len(values)} values")
        if not keys:
            return 0

        def pipelined_set() -> int:
            pipe = self.client.pipeline(transaction=False)
            for key, value in zip(self._keys(keys), values):
                pipe.set(key, value)
            results = pipe.execute(raise_on_error=False)
            errors = [r for r in results if isinstance(r, Exception)]
            if errors:
                raise errors[0]
            return len(results)

        return self._run(pipelined_set)

    def get(self, keys: Sequence[bytes]) -> list[bytes]:
        if not keys:
            return []
        values = self._run(self.client.mget, self._keys(keys))
        out: list[bytes] = []
        for value in values:
            if value is None:
                break
            out.append(value)
        return out

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        if not keys:
            return []

        def pipelined_exists() -> list[bool]:
            pipe = self.client.pipeline(transaction=False)
            for key in self._keys(keys):
                pipe.exists(key)
            return [bool(n) for n in pipe.execute()]

        return self._run(pipelined_exists)

    def prefix_length(self, keys: Sequence[bytes]) -> int:
        n, chunk = 0, PREFIX_CHUNK
        while n < len(keys):
            present = self.contains(keys[n:n + chunk])
            for ok in present:
                if not ok:
                    return n
                n += 1
            chunk *= 4
        return n

    def delete(self, keys: Sequence[bytes]) -> int:
        if not keys:
            return 0
        return int(self._run(self.client.delete, *self._keys(keys)))

    def stats(self) -> StoreStats:
        def read() -> StoreStats:
            info = self.client.info("memory")
            limit = int(info.get("maxmemory", 0)) or None
            return StoreStats("redis", int(self.client.dbsize()), int(info["used_memory"]),
                              limit, int(self.client.info("stats").get("evicted_keys", 0)))

        return self._run(read)

    def close(self) -> None:
        self.client.close()
