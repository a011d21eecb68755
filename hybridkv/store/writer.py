"""Write-behind: evicted blocks go to the store from a background thread.

The engine hands over blocks already copied out of the device pages
(`submit`, a batch per group: the blocks' hashes and one array of their
data); a daemon thread encodes them (header + checksum) and puts them, the
batches of a group merged into one store call (`KVStore.put_blocks`), off
the step's critical path. Until a block is written it stays readable from
memory (`read`), so a block evicted and asked for again right away is
still a store hit.

Memory is bounded: past `max_pending_bytes` of unwritten data new batches
are dropped, not queued: counted (`dropped_blocks`, in the tier's stats)
and warned about once.

A store that does no I/O (`KVStore.inline_writes`: the cpu store) gets the
blocks of a step straight from the caller when they come to at most
`inline_bytes` and nothing is queued: encoding and storing a few KiB costs
less than handing them to the thread (a lock, a wake-up, the thread taking
the GIL from the engine's). Larger steps go through the thread.

With `skip_stored` (a store other instances write too) the thread asks the
store which of a batch's keys it holds already and puts only the others
(counted in `skipped_blocks`): one existence query costs less than
sending blocks another instance stored.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Container, Sequence
from itertools import repeat

import numpy as np

from hybridkv.store.guard import StoreGuard
from hybridkv.store.payload import HEADER_BYTES, BlockLayout

DEFAULT_MAX_PENDING_BYTES = 256 << 20
# a step's evicted blocks up to this many bytes are written inline (when the store allows)
DEFAULT_INLINE_BYTES = 64 << 10
# one store call takes at most this many blocks and bytes (queued batches of a group
# are merged up to that)
MAX_BLOCKS_PER_PUT = 1024
MAX_BYTES_PER_PUT = 16 << 20
# the thread is woken once this many blocks or bytes wait (or on flush), else it looks
# every WAKE_SECONDS: waking it for every small batch costs more than the batch
WAKE_BLOCKS = 256
WAKE_BYTES = 4 << 20
WAKE_SECONDS = 0.05
IDLE_LOOKS = 20


class _Batch:
    """Blocks of one group: `data[:, i]` is the block of hash `hashes[i]`."""

    __slots__ = ("group_id", "hashes", "data", "nbytes", "shared")

    def __init__(self, group_id: int, hashes: list[bytes], data: np.ndarray) -> None:
        self.group_id = group_id
        self.hashes = hashes
        self.data = data  # uint8 [num_layers, n, layer_bytes]
        self.nbytes = data.nbytes
        self.shared = False  # a later batch queued some hash again while this one waited

    def block(self, block_hash: bytes) -> bytes:
        i = self.hashes.index(block_hash)
        data = self.data
        return data[0, i].tobytes() if data.shape[0] == 1 else data[:, i].tobytes()


class BackgroundWriter:
    """A queue of blocks to put and the thread that puts them.

    Group g's block of hash h is stored under `key_prefixes[g] + h`, as
    `layouts[g]` says. `on_written(group_id, num_blocks, num_bytes, seconds)`
    is called from the thread after each store call that stored something.
    """

    def __init__(self, guard: StoreGuard, layouts: Sequence[BlockLayout],
                 key_prefixes: Sequence[bytes],
                 on_written: Callable[[int, int, int, float], None], *,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 inline_bytes: int = DEFAULT_INLINE_BYTES, skip_stored: bool = False) -> None:
        if len(key_prefixes) != len(layouts):
            raise ValueError(f"{len(key_prefixes)} key prefixes for {len(layouts)} groups")
        self.guard = guard
        self.layouts = list(layouts)
        self.key_prefixes = list(key_prefixes)
        self.on_written = on_written
        self.max_pending_bytes = max_pending_bytes
        self.inline_bytes = inline_bytes if guard.store.inline_writes else 0
        self.inline_blocks = 0  # blocks written by the caller's thread (see above)
        self.dropped_blocks = 0
        self.skip_stored = skip_stored
        self.skipped_blocks = 0  # blocks not put: the store held them already
        self.cpu_seconds = 0.0  # the thread's CPU time writing
        self._queue: deque[_Batch] = deque()
        self._queued_blocks = 0
        # per group: hash -> the latest batch holding it
        self._pending: list[dict[bytes, _Batch]] = [{} for _ in self.layouts]
        self._pending_bytes = 0
        self._busy = False
        self._asleep = True  # waiting for a submit to wake it (see _run)
        self._writing: list[_Batch] = []  # the batches the thread is writing
        self._flushing = False
        self._first_queued = 0.0  # when the oldest queued batch arrived
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hybridkv-store-writer",
                                        daemon=True)
        self._thread.start()

    # ---- the engine's side -----------------------------------------------------

    def submit(self, group_id: int, hashes: list[bytes], data: np.ndarray) -> bool:
        """Queue blocks of a group for writing (`data[:, i]`: the block of
        `hashes[i]`); False (dropped) when too much is pending."""
        return self.submit_many([(group_id, hashes, data)]) == 1

    def inline_ok(self, num_bytes: int) -> bool:
        """Whether blocks of `num_bytes` may be written by the caller now (the
        store allows it, they are few, nothing is queued before them). Only the
        engine's thread submits, so nothing gets queued between this and the write."""
        return 0 < num_bytes <= self.inline_bytes \
            and not (self._queue or self._busy or self._closed)

    def write_pages(self, group_id: int, hashes: list[bytes], ids: bytes,
                    views: list[np.ndarray]) -> None:
        """Write blocks inline, encoded straight from the pages (`KVStore.put_pages`;
        after `inline_ok`)."""
        t0 = time.perf_counter()
        layout = self.layouts[group_id]
        stored = self.guard.put_pages(layout, self.key_prefixes[group_id], hashes, ids, views)
        self.inline_blocks += len(hashes)
        if stored:
            self.on_written(group_id, stored, stored * (HEADER_BYTES + layout.data_bytes),
                            time.perf_counter() - t0)

    def submit_many(self, batches: Sequence[tuple[int, list[bytes], np.ndarray]]) -> int:
        """`submit` several batches at once; how many were taken (written or queued)."""
        if self.inline_ok(sum(b[2].nbytes for b in batches)):
            for group_id, hashes, data in batches:
                self._write_inline(group_id, hashes, data)
            return len(batches)
        queued = 0
        with self._cond:
            for group_id, hashes, data in batches:
                queued += self._queue_batch(_Batch(group_id, hashes, data))
            if queued and (self._asleep or self._queued_blocks >= WAKE_BLOCKS
                           or self._pending_bytes >= WAKE_BYTES):
                self._cond.notify()
        return queued

    def _queue_batch(self, batch: _Batch) -> bool:
        """Queue one batch, or drop it when too much is pending (lock held)."""
        n = len(batch.hashes)
        if self._closed or self._pending_bytes + batch.nbytes > self.max_pending_bytes:
            self._drop(n)
            return False
        pending = self._pending[batch.group_id]
        size = len(pending)
        pending.update(zip(batch.hashes, repeat(batch)))
        if len(pending) != size + n:  # (rare) hashes queued twice: see _forget
            self._mark_shared(batch)
        self._pending_bytes += batch.nbytes
        if not self._queue:
            self._first_queued = time.monotonic()
        self._queue.append(batch)
        self._queued_blocks += n
        return True

    def _drop(self, num_blocks: int) -> None:
        self.dropped_blocks += num_blocks
        if not self._closed:
            self.guard.warn_once("dropped", f"kv store {self.guard.store.describe()}: the "
                                            f"writer's backlog is full (max_pending_bytes="
                                            f"{self.max_pending_bytes}); blocks to write are "
                                            f"dropped instead of stored (counted in "
                                            f"dropped_blocks)")

    def has(self, group_id: int, block_hash: bytes) -> bool:
        """Whether the group's block of this hash waits to be written."""
        return block_hash in self._pending[group_id]

    def pending(self, group_id: int) -> Container[bytes]:
        """The hashes of the group's blocks waiting to be written (a live view)."""
        return self._pending[group_id].keys()

    def read(self, group_id: int, block_hash: bytes) -> bytes | None:
        """The raw data of a block waiting to be written, or None."""
        batch = self._pending[group_id].get(block_hash)
        return None if batch is None else batch.block(block_hash)

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
                idle = 0
                while not self._ready():
                    # a batch is written once WAKE_BLOCKS or WAKE_BYTES wait, or when the
                    # oldest has waited WAKE_SECONDS; the thread looks every WAKE_SECONDS
                    # (a submit wakes it only past those bounds: each wake-up costs the
                    # engine's thread a switch of the GIL) and sleeps for good after
                    # IDLE_LOOKS looks at an empty queue (then a submit wakes it)
                    if self._queue:
                        left = self._first_queued + WAKE_SECONDS - time.monotonic()
                        if left <= 0:
                            break
                    else:
                        idle += 1
                        left = WAKE_SECONDS
                    self._asleep = idle > IDLE_LOOKS
                    self._cond.wait(None if self._asleep else left)
                self._asleep = False
                if self._closed and not self._queue:
                    return
                batches = self._take()
                self._writing = [b for bs in batches.values() for b in bs]
                self._busy = True
            start = time.thread_time()
            try:
                for group_id, group_batches in batches.items():
                    self._write(group_id, group_batches)
            finally:
                self.cpu_seconds += time.thread_time() - start
                with self._cond:
                    for batch in self._writing:
                        self._forget(batch)
                    self._writing = []
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
        """Queued batches up to MAX_BLOCKS_PER_PUT blocks and MAX_BYTES_PER_PUT
        bytes (at least one batch), by group (lock held)."""
        out: dict[int, list[_Batch]] = {}
        num_blocks = num_bytes = 0
        queue = self._queue
        while queue and (num_blocks == 0 or (
                num_blocks + len(queue[0].hashes) <= MAX_BLOCKS_PER_PUT
                and num_bytes + queue[0].nbytes <= MAX_BYTES_PER_PUT)):
            batch = queue.popleft()
            out.setdefault(batch.group_id, []).append(batch)
            num_blocks += len(batch.hashes)
            num_bytes += batch.nbytes
        self._queued_blocks -= num_blocks
        self._first_queued = time.monotonic()  # the rest waits from now on
        return out

    def _write(self, group_id: int, batches: list[_Batch]) -> None:
        """Put a group's batches in one call. A put makes its first keys the most
        recent, so the batches go newest first: as if each were put in turn."""
        if len(batches) == 1:
            self._put(group_id, batches[0].hashes, batches[0].data)
        else:
            newest_first = batches[::-1]
            self._put(group_id, [h for batch in newest_first for h in batch.hashes],
                      np.concatenate([batch.data for batch in newest_first], axis=1))

    def _write_inline(self, group_id: int, hashes: list[bytes], data: np.ndarray) -> None:
        self._put(group_id, hashes, data)
        self.inline_blocks += len(hashes)

    def _put(self, group_id: int, hashes: list[bytes], data: np.ndarray) -> None:
        t0 = time.perf_counter()
        if self.skip_stored:
            hashes, data = self._not_stored(group_id, hashes, data)
            if not hashes:
                return
        layout = self.layouts[group_id]
        stored = self.guard.put_blocks(layout, self.key_prefixes[group_id], hashes, data)
        if stored:
            self.on_written(group_id, stored, stored * (HEADER_BYTES + layout.data_bytes),
                            time.perf_counter() - t0)

    def _not_stored(self, group_id: int, hashes: list[bytes],
                    data: np.ndarray) -> tuple[list[bytes], np.ndarray]:
        """The blocks of a batch the store does not hold yet (a store that
        fails to answer holds none: they are put)."""
        held = self.guard.contains_blocks(self.key_prefixes[group_id], hashes)
        keep = [i for i, ok in enumerate(held) if not ok]
        if len(keep) == len(hashes):
            return hashes, data
        self.skipped_blocks += len(hashes) - len(keep)
        return [hashes[i] for i in keep], data[:, keep]

    def _mark_shared(self, batch: _Batch) -> None:
        """`batch` took over hashes of batches still pending: mark those, so that
        forgetting them leaves the newer entries (lock held)."""
        hashes = set(batch.hashes)
        for older in (*self._queue, *self._writing):
            if older.group_id == batch.group_id and not hashes.isdisjoint(older.hashes):
                older.shared = True
        batch.shared = True

    def _forget(self, batch: _Batch) -> None:
        """Drop a written batch from the pending map (lock held); a hash queued
        again since then keeps its newer entry."""
        pending = self._pending[batch.group_id]
        if batch.shared:
            for block_hash in batch.hashes:
                if pending.get(block_hash) is batch:
                    del pending[block_hash]
        else:
            deque(map(pending.pop, batch.hashes, repeat(None)), maxlen=0)
        self._pending_bytes -= batch.nbytes
