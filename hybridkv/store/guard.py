"""Calls into a store that may fail: a failure is a miss, one warning, and a retry later.

A store that is down at start, goes down, times out or is full must cost a
recompute, never a failed request. `StoreGuard` wraps every call: a
`StoreError` or `OSError` marks the store unavailable for a back-off delay
(0.5 s, doubling to 30 s) during which calls return "nothing stored"
without touching it; the first call after the delay tries again. A full
store only drops that write. One warning is issued per kind of trouble
(down, full); reconnects are logged.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from hybridkv.store.base import KVStore, StoreError, StoreFull
from hybridkv.store.payload import BlockLayout

log = logging.getLogger("hybridkv.store")
T = TypeVar("T")
FIRST_DELAY = 0.5
MAX_DELAY = 30.0


class StoreGuard:
    """A KVStore's calls with failures turned into misses (thread-safe)."""

    def __init__(self, store: KVStore, *, clock: Callable[[], float] = time.monotonic,
                 first_delay: float = FIRST_DELAY, max_delay: float = MAX_DELAY) -> None:
        self.store = store
        self.clock = clock
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.errors = 0  # failed calls
        self.skipped_calls = 0  # calls not tried while the store was unavailable
        self.full_writes = 0  # writes refused by a full store
        self._delay = 0.0
        self._retry_at = 0.0
        self._down = False
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        """False while a failure's back-off delay runs."""
        return not self._down or self.clock() >= self._retry_at

    def _call(self, fn: Callable[..., T], args: tuple, fallback: T, what: str) -> T:
        """`fn(*args)`, or `fallback` when it fails or the store is resting."""
        if self._down and self.clock() < self._retry_at:
            self.skipped_calls += 1
            return fallback
        try:
            result = fn(*args)
        except StoreFull as e:
            self._note_full(e)
            return fallback
        except (StoreError, OSError) as e:
            self._note_failure(e, what)
            return fallback
        if self._down:
            with self._lock:
                self._down, self._delay = False, 0.0
            log.warning("kv store %s is answering again", self.store.describe())
        return result

    def _note_failure(self, error: Exception, what: str) -> None:
        with self._lock:
            self.errors += 1
            self._delay = min(self.max_delay, max(self.first_delay, self._delay * 2))
            self._retry_at = self.clock() + self._delay
            self._down = True
        log.info("kv store %s: %s failed (%s); retrying in %.1f s", self.store.describe(),
                 what, error, self._delay)
        self.warn_once("down", f"kv store {self.store.describe()} failed ({what}: {error}); "
                               f"blocks are recomputed instead of loaded until it answers "
                               f"(retrying with back-off)")

    def _note_full(self, error: Exception) -> None:
        with self._lock:
            self.full_writes += 1
        self.warn_once("full", f"kv store {self.store.describe()} is full ({error}); "
                               f"evicted blocks are dropped instead of stored")

    def warn_once(self, kind: str, message: str) -> None:
        """Issue `message` as a RuntimeWarning the first time `kind` happens."""
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    # ---- the store's calls -----------------------------------------------------

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
        return self._call(self.store.put, (keys, values), 0, "put")

    def put_blocks(self, layout: BlockLayout, key_prefix: bytes, hashes: Sequence[bytes],
                   data: np.ndarray) -> int:
        return self._call(self.store.put_blocks, (layout, key_prefix, hashes, data), 0, "put")

    def put_pages(self, layout: BlockLayout, key_prefix: bytes, hashes: Sequence[bytes],
                  ids: bytes, views: list[np.ndarray]) -> int:
        return self._call(self.store.put_pages, (layout, key_prefix, hashes, ids, views), 0,
                          "put")

    def get(self, keys: Sequence[bytes]) -> list[bytes]:
        return self._call(self.store.get, (keys,), [], "get")

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        return self._call(self.store.contains, (keys,), [False] * len(keys), "contains")

    def prefix_length(self, keys: Sequence[bytes]) -> int:
        return self._call(self.store.prefix_length, (keys,), 0, "prefix_length")

    def prefix_length_blocks(self, key_prefix: bytes, hashes: Sequence[bytes]) -> int:
        return self._call(self.store.prefix_length_blocks, (key_prefix, hashes), 0,
                          "prefix_length")

    def contains_blocks(self, key_prefix: bytes, hashes: Sequence[bytes]) -> list[bool]:
        return self._call(self.store.contains_blocks, (key_prefix, hashes),
                          [False] * len(hashes), "contains")

    def delete(self, keys: Sequence[bytes]) -> int:
        return self._call(self.store.delete, (keys,), 0, "delete")

    def flush(self) -> None:
        self._call(self.store.flush, (), None, "flush")
