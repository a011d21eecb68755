"""Write-behind: evicted blocks go to the store from a background thread.

The engine hands over blocks already copied out of the device pages
(`submit`); a daemon thread encodes them (header + checksum) and puts them,
several batches per store call, off the step's critical path. Until a
block is written it stays readable from memory (`read`), so a block
evicted and asked for again right away is still a store hit.

Memory is bounded: past `max_pending_bytes` of unwritten data new batches
are dropped (counted), not queued.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat

import numpy as np

from hybridkv.store.guard import StoreGuard
from hybridkv.store.payload import BlockLayout, encode_block

DEFAULT_MAX_PENDING_BYTES = 256 << 20
# blocks per store call at most (several submitted batches are merged up to this)
MAX_BLOCKS_PER_PUT = 256
# the thread is woken once this many blocks or bytes wait (or on flush), else it looks
# every WAKE_SECONDS: waking it for every small batch costs more than the batch
WAKE_BLOCKS = 64
WAKE_BYTES = 4 << 20
WAKE_SECONDS = 0.05


class _Batch:
    """Blocks of one group: `data[:, i]` is the block under `keys[i]`."""

    __slots__ = ("group_id", "keys", "data", "nbytes")

    def __init__(self, group_id: int, keys: list[bytes], data: np.ndarray) -> None:
        self.group_id = group_id
        self.keys = keys
        self.data = data  # uint8 [num_layers, n, layer_bytes]
        self.nbytes = data.nbytes

    def block(self, i: int) -> bytes:
        data = self.data
        return data[0, i].tobytes() if data.shape[0] == 1 else data[:, i].tobytes()

    def blocks(self) -> list[memoryview]:
        """Every block's data, block after block (one copy of the batch)."""
        data = np.ascontiguousarray(self.data.transpose(1, 0, 2))  # [n, num_layers, bytes]
        view = memoryview(data).cast("B")
        size = data[0].nbytes if len(data) else 0
        return [view[i * size:(i + 1) * size] for i in range(len(data))]


class BackgroundWriter:
    """A queue of blocks to put and the thread that puts them.

    `on_written(group_id, num_blocks, num_bytes, seconds)` is called from
    the thread after each store call that stored something.
    """

    def __init__(self, guard: StoreGuard, layouts: Sequence[BlockLayout],
                 on_written: Callable[[int, int, int, float], None], *,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> None:
        self.guard = guard
        self.layouts = list(layouts)
        self.on_written = on_written
        self.max_pending_bytes = max_pending_bytes
        self.dropped_blocks = 0
        self.cpu_seconds = 0.0  # the thread's CPU time writing
        self._queue: deque[_Batch] = deque()
        self._queued_blocks = 0
        self._pending: dict[bytes, tuple[_Batch, int]] = {}
        self._pending_bytes = 0
        self._busy = False
        self._flushing = False
        self._first_queued = 0.0  # when the oldest queued batch arrived
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hybridkv-store-writer",
                                        daemon=True)
        self._thread.start()

    # ---- the engine's side -----------------------------------------------------

    def submit(self, group_id: int, keys: list[bytes], data: np.ndarray) -> bool:
        """Queue blocks for writing; False (dropped) when too much is pending."""
        batch = _Batch(group_id, keys, data)
        with self._cond:
            if self._closed or self._pending_bytes + batch.nbytes > self.max_pending_bytes:
                self.dropped_blocks += len(keys)
                return False
            self._pending.update(zip(keys, zip(repeat(batch), range(len(keys)))))
            self._pending_bytes += batch.nbytes
            if not self._queue:
                self._first_queued = time.monotonic()
            self._queue.append(batch)
            self._queued_blocks += len(keys)
            if len(self._queue) == 1 or self._queued_blocks >= WAKE_BLOCKS \
                    or self._pending_bytes >= WAKE_BYTES:
                self._cond.notify()  # the first batch starts the thread's timed wait
        return True

    def has(self, key: bytes) -> bool:
        """Whether the block under `key` waits to be written."""
        return key in self._pending

    def read(self, key: bytes) -> bytes | None:
        """The raw data of a block waiting to be written, or None."""
        entry = self._pending.get(key)
        if entry is None:
            return None
        batch, i = entry
        return batch.block(i)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted is written; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushing = True
            self._cond.notify_all()
            try:
                while self._queue or self._busy:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._flushing = False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to `timeout` seconds), then stop the thread."""
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ---- the thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._ready():
                    # nothing queued: sleep until a submit; else until the oldest batch
                    # has waited WAKE_SECONDS (a lone batch is written that late at most)
                    left = None if not self._queue else \
                        self._first_queued + WAKE_SECONDS - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cond.wait(left)
                if self._closed and not self._queue:
                    return
                batches = self._take()
                self._busy = True
            start = time.thread_time()
            try:
                for group_id, group_batches in batches.items():
                    self._write(group_id, group_batches)
            finally:
                self.cpu_seconds += time.thread_time() - start
                with self._cond:
                    for batch in (b for bs in batches.values() for b in bs):
                        self._forget(batch)
                    self._busy = False
                    self._cond.notify_all()

    def _ready(self) -> bool:
        """Whether the thread has work worth waking for, or must stop (lock held)."""
        if self._closed:
            return True
        if not self._queue:
            return False
        return self._flushing or self._queued_blocks >= WAKE_BLOCKS \
            or self._pending_bytes >= WAKE_BYTES

    def _take(self) -> dict[int, list[_Batch]]:
        """Queued batches up to MAX_BLOCKS_PER_PUT blocks, by group (lock held)."""
        out: dict[int, list[_Batch]] = {}
        num_blocks = 0
        while self._queue and (num_blocks == 0 or num_blocks + len(self._queue[0].keys)
                               <= MAX_BLOCKS_PER_PUT):
            batch = self._queue.popleft()
            out.setdefault(batch.group_id, []).append(batch)
            num_blocks += len(batch.keys)
        self._queued_blocks -= num_blocks
        self._first_queued = time.monotonic()  # the rest waits from now on
        return out

    def _write(self, group_id: int, batches: list[_Batch]) -> None:
        t0 = time.perf_counter()
        layout = self.layouts[group_id]
        keys: list[bytes] = []
        values: list[bytes] = []
        for batch in batches:
            blocks = batch.blocks()
            keys += batch.keys
            values += [encode_block(layout, key, data) for key, data in zip(batch.keys, blocks)]
        stored = self.guard.put(keys, values)
        if stored:
            self.on_written(group_id, stored, sum(map(len, values)), time.perf_counter() - t0)

    def _forget(self, batch: _Batch) -> None:
        """Drop a written batch from the pending map (lock held); a key submitted
        again since then keeps its newer entry."""
        for i, key in enumerate(batch.keys):
            entry = self._pending.get(key)
            if entry is not None and entry[0] is batch and entry[1] == i:
                del self._pending[key]
        self._pending_bytes -= batch.nbytes
