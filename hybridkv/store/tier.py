"""KVTier: a KV store behind a KVCacheManager's device pool.

Out: when the pool takes a cached block for new data (`on_evict`), the
tier copies the block's pages out at once (they are overwritten next) and
a background writer puts them in the store. Selection is hybrid-aware by
default: full-attention blocks always (any prefix of a hit is a hit), the
windows and Mamba states of other groups unless the group rated them low
value (no likely hit stops where they are needed); `select="all"` stores
every evicted block. `write_through=True` writes each block once its step
has computed it instead.

A store other instances share (`KVStore.shared`, or `shared_writes=True`)
also gets, once computed, the blocks hits at a prompt's stops need
(`hybridkv.store.shared_writes`), so the others can load what this
instance still holds; each block once, within a per-step copy budget.

In: `extend_hit` runs after the pool's own lookup. It asks the store which
of the request's missing blocks it holds, runs the hybrid fixed point over
pool and store together (a group's rule is met when each block it needs is
in either), and when that reaches further and the request would fit,
imports the store's blocks into new pool blocks (checked payloads only),
so the usual allocation path reuses them. Anything the store cannot give,
or gives damaged, is simply not imported: the hit is shorter and the rest
is recomputed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.events import BlockEvent, BlockStored
from hybridkv.kv_cache.eviction import LOW_VALUE
from hybridkv.kv_cache.external import EXTERNAL, ImportSlot
from hybridkv.kv_cache.kv_cache_manager import KVCacheBlocks, KVCacheManager
from hybridkv.kv_cache.managers.base import Lookup
from hybridkv.kv_cache.request import Request
from hybridkv.store.base import KVStore, StoreStats
from hybridkv.store.codec import eviction_recorder
from hybridkv.store.guard import StoreGuard
from hybridkv.store.keys import KeySpace
from hybridkv.store.pages import Buffer, PageIO
from hybridkv.store.payload import BlockLayout, PayloadError, decode_block
from hybridkv.store.selection import Selection
from hybridkv.store.shared_writes import DEFAULT_STEP_BYTES, SharedWrites
from hybridkv.store.stats import GroupTierStats, KVStoreStats
from hybridkv.store.writer import (
    DEFAULT_INLINE_BYTES,
    DEFAULT_MAX_PENDING_BYTES,
    BackgroundWriter,
)


class TierHit(NamedTuple):
    """A request's hit over pool and store (see `KVTier.extend_hit`)."""

    blocks: KVCacheBlocks
    num_tokens: int
    num_external_tokens: int  # of num_tokens, reusable only because the store held them
    must_wait: bool  # the store holds more than fits now: wait rather than recompute


class KVTier:
    """Connects `store` to `kv`'s pool, whose pages `pages` reads and writes.

    `fingerprint` (16 bytes) names the model and cache layout in every key.
    `shared_writes` (default: the store's `shared`) writes blocks at compute
    time too, copying at most `step_write_bytes` of them out per step.
    """

    def __init__(self, kv: KVCacheManager, store: KVStore, pages: PageIO, fingerprint: bytes,
                 *, write_through: bool = False, select: str = "hybrid",
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 inline_write_bytes: int = DEFAULT_INLINE_BYTES,
                 shared_writes: bool | None = None,
                 step_write_bytes: int = DEFAULT_STEP_BYTES) -> None:
        self.kv = kv
        self.managers = kv.coordinator.managers
        self.store = store
        self.guard = StoreGuard(store)
        self.pages = pages
        self.selection = Selection(self.managers, select)
        self.write_through = bool(write_through)
        self.keys = KeySpace(fingerprint, len(self.managers))
        self.layouts = [BlockLayout(fingerprint, g, *_layout_fields(pages.layout(g)))
                        for g in range(len(self.managers))]
        self._stats = KVStoreStats(url=store.describe(),
                                   groups=[GroupTierStats() for _ in self.managers])
        self._lock = threading.Lock()  # stats written by the writer thread
        if shared_writes is None:
            shared_writes = store.shared
        shared_writes = bool(shared_writes) and not self.write_through
        self.writer = BackgroundWriter(self.guard, self.layouts, self.keys.prefixes,
                                       self._on_written, max_pending_bytes=max_pending_bytes,
                                       inline_bytes=inline_write_bytes,
                                       skip_stored=shared_writes)
        self.shared = SharedWrites(
            self.managers, kv.pool.cached, [layout.data_bytes for layout in self.layouts],
            kv.coordinator.alignment, self._submit_ids,
            step_bytes=step_write_bytes) if shared_writes else None
        # (group, hash, block id) of blocks cached since `after_step` (write-through)
        self._computed: list[tuple[int, bytes, int]] = []
        self._importing = False
        self._align = kv.coordinator.alignment
        self._closed = [(g, m) for g, m in enumerate(self.managers) if m.downward_closed]
        self._noting = self.selection.notes_prompts
        self._host_views = [getattr(pages, "host_views", lambda g: None)(g)
                            for g in range(len(self.managers))]
        self._max_block_bytes = max(layout.data_bytes for layout in self.layouts)
        # write-behind: the pool's eviction hook notes the evicted blocks worth storing
        # (`Selection.worth_storing`) until `before_step` copies them out
        self.recorder = None if self.write_through else eviction_recorder(
            self.selection.always, int(LOW_VALUE), self.selection.tails_for_recorder())
        if self.recorder is None:
            kv.subscribe(self._on_event)
        else:
            kv.on_evict(self.recorder, skips_empty=True)

    # ---- in: hits through the store ----------------------------------------------

    def extend_hit(self, request: Request, blocks: KVCacheBlocks, num_tokens: int,
                   budget: int, can_wait: bool = True) -> TierHit:
        """The pool's hit (`blocks`, `num_tokens`) extended by the store.

        Imports blocks into the pool when the request, with up to `budget`
        new tokens, then fits. When the store holds a longer hit that does
        not fit yet, `must_wait` is set (if `can_wait`: other requests will
        free blocks) instead of giving it up for a recompute. With shared
        writes, the request's blocks at its stops are awaited for writing.
        """
        hit = self._extend_hit(request, blocks, num_tokens, budget, can_wait)
        if self.shared is not None and self.kv.enable_caching:
            hashes = request.block_hashes(self.kv.hash_algo, self.kv.hash_block_size)
            self.shared.watch(request, hashes, hit.num_tokens)
        return hit

    def _extend_hit(self, request: Request, blocks: KVCacheBlocks, num_tokens: int,
                    budget: int, can_wait: bool) -> TierHit:
        kv = self.kv
        pool_hit = TierHit(blocks, num_tokens, 0, False)
        if not kv.enable_caching:
            return pool_hit
        hashes = request.block_hashes(kv.hash_algo, kv.hash_block_size)
        if self._noting:
            self.selection.note_prompt(request, hashes)
        limit = (request.num_tokens - 1) // self._align * self._align
        if num_tokens >= limit:
            return pool_hit
        self._stats.lookups += 1
        self._stats.queried_tokens += request.num_tokens
        lookups = self._lookups(hashes, limit, num_tokens)
        if lookups is None:
            return pool_hit
        hit, reach, _ = kv.find_cache_hit(request, lookups)
        if reach <= num_tokens:
            return pool_hit
        num_new = min(request.num_tokens - reach, budget)
        if kv.num_blocks_to_admit(request, hit, reach, num_new) > kv.num_free_blocks:
            if can_wait and not num_tokens:  # (the store will serve it: not a miss)
                kv.note_reuse_elsewhere(request)
            return pool_hit._replace(must_wait=can_wait)
        if not self._import(hit, hashes):  # nothing arrived (gone, damaged, store down)
            return pool_hit
        new_blocks, new_tokens, matched = kv.find_cache_hit(request)
        if new_tokens <= num_tokens:
            return pool_hit
        kv.note_junction(request, matched)  # where the prompt now diverges from the cache
        if not num_tokens:  # the pool's lookup counted a miss the store made good
            kv.note_reuse_elsewhere(request)
        gained = new_tokens - num_tokens
        self._stats.hit_requests += 1
        self._stats.hit_tokens += gained
        return TierHit(new_blocks, new_tokens, gained, False)

    def _lookups(self, hashes: Sequence[bytes], limit: int,
                 num_pool_tokens: int) -> list[Lookup] | None:
        """Per group, a lookup finding pool blocks or EXTERNAL for blocks the
        store (or the writer's backlog) holds; None when the store cannot
        take the hit past `num_pool_tokens`."""
        upper = limit
        found: list[set[bytes]] = [set() for _ in self.managers]
        for g, m in self._closed:
            # the pool's hit holds the blocks before num_pool_tokens
            start = num_pool_tokens // m.block_size
            reach = self._reach(g, m.group_hashes(hashes, limit // m.block_size), start,
                                found[g]) if m.accepts_lookup else start
            upper = min(upper, reach * m.block_size)
            if upper <= num_pool_tokens:
                return None
        upper = upper // self._align * self._align
        if upper <= num_pool_tokens:
            return None
        self._find_others(hashes, upper, found)
        return [self._lookup(g, found[g]) for g in range(len(self.managers))]

    def _find_others(self, hashes: Sequence[bytes], upper: int, found: list[set[bytes]]) -> None:
        """Fill `found` for the groups that are not full attention: which of
        their blocks below `upper` missing from the pool are held (one query)."""
        asked: list[tuple[int, bytes]] = []
        for g, m in enumerate(self.managers):
            if m.downward_closed or not m.accepts_lookup:
                continue
            table = self.kv.pool.cached[g]
            asked += [(g, h) for h in m.group_hashes(hashes, upper // m.block_size)
                      if h not in table]
        if asked:
            present = self._held(asked)
            for (g, h), ok in zip(asked, present):
                if ok:
                    found[g].add(h)

    def _lookup(self, group_id: int, found: set[bytes]) -> Lookup:
        get = self.kv.pool.cached[group_id].get
        if not found:
            return get

        def lookup(block_hash: bytes) -> Block | None:
            block = get(block_hash)
            if block is None and block_hash in found:
                return EXTERNAL
            return block

        return lookup

    def _reach(self, group_id: int, hashes: Sequence[bytes], start: int,
               found: set[bytes]) -> int:
        """How many leading blocks of a full-attention group the pool, the writer's
        backlog or the store hold, from `start` on; adds the ones only the latter
        two hold to `found`. One store query per run of blocks the store holds."""
        table, pending = self.kv.pool.cached[group_id], self.writer.pending(group_id)
        n = start
        while n < len(hashes):
            block_hash = hashes[n]
            if block_hash in table:
                n += 1
            elif block_hash in pending:
                found.add(block_hash)
                n += 1
            else:
                stored = self.guard.prefix_length_blocks(self.keys.prefixes[group_id],
                                                         hashes[n:])
                if not stored:
                    break
                found.update(hashes[n:n + stored])
                n += stored
        return n

    def _held(self, blocks: Sequence[tuple[int, bytes]]) -> list[bool]:
        """Whether the writer's backlog or the store holds each (group, hash)."""
        out = [self.writer.has(g, h) for g, h in blocks]
        ask = [i for i, held in enumerate(out) if not held]
        if ask:
            keys = [self.keys.key(*blocks[i]) for i in ask]
            for i, present in zip(ask, self.guard.contains(keys)):
                out[i] = present
        return out

    # ---- importing -------------------------------------------------------------------

    def _import(self, hit: KVCacheBlocks, hashes: Sequence[bytes]) -> bool:
        """Load the hit's EXTERNAL blocks into new pool blocks; True if any arrived."""
        wanted: list[tuple[int, bytes]] = []
        for g, (m, group_blocks) in enumerate(zip(self.managers, hit.blocks)):
            group_hashes = m.group_hashes(hashes, len(group_blocks))
            wanted += [(g, group_hashes[i]) for i, b in enumerate(group_blocks)
                       if b is EXTERNAL]
        imp = self.kv.begin_import(hit, wanted)
        if imp is None:  # (not after the caller's check: holding frees nothing)
            return False
        self._importing = True
        try:
            t0, c0 = time.perf_counter(), time.thread_time()
            fetched = self._fetch(imp.slots)
            t1, c1 = time.perf_counter(), time.thread_time()
            # the blocks the import took may hold evicted data: copy it out before
            # loading into them (after the reads: storing it may push the wanted
            # blocks out of a small store)
            self.before_step()
            t2, c2 = time.perf_counter(), time.thread_time()
            loaded = self._scatter(imp.slots, fetched)
            self.kv.end_import(imp, loaded)
        finally:
            self._importing = False
        self._stats.load_seconds += t1 - t0 + time.perf_counter() - t2
        self._stats.load_cpu_seconds += c1 - c0 + time.thread_time() - c2
        return any(loaded)

    def _fetch(self, slots: Sequence[ImportSlot]) -> dict[int, tuple[list[int], list[Buffer]]]:
        """Per group, the slots whose block arrived (read and checked) and its data."""
        by_group: dict[int, list[int]] = {}
        for j, slot in enumerate(slots):
            by_group.setdefault(slot.group_id, []).append(j)
        out: dict[int, tuple[list[int], list[Buffer]]] = {}
        for g, js in by_group.items():
            t0 = time.perf_counter()
            data = self._read(g, [slots[j].block_hash for j in js])
            self._stats.groups[g].load_seconds += time.perf_counter() - t0
            got = [(j, d) for j, d in zip(js, data) if d is not None]
            if got:
                out[g] = ([j for j, _ in got], [d for _, d in got])
        return out

    def _scatter(self, slots: Sequence[ImportSlot],
                 fetched: dict[int, tuple[list[int], list[Buffer]]]) -> list[bool]:
        """Copy the fetched blocks into their slots' pool blocks; which slots got one."""
        loaded = [False] * len(slots)
        for g, (js, data) in fetched.items():
            t0 = time.perf_counter()
            self.pages.scatter(g, [slots[j].block.block_id for j in js], data)
            self._stats.groups[g].load_seconds += time.perf_counter() - t0
            for j in js:
                loaded[j] = True
            if self.shared is not None:  # (the store has them: never written back)
                self.shared.note_written(g, [slots[j].block_hash for j in js])
            stats = self._stats.groups[g]
            stats.loaded_blocks += len(js)
            stats.loaded_tokens += len(js) * self.managers[g].block_size
            stats.read_bytes += len(js) * self.layouts[g].data_bytes
        return loaded

    def _read(self, group_id: int, hashes: list[bytes]) -> list[bytes | memoryview | None]:
        """Checked block data per hash (None: not available or rejected)."""
        data: list[bytes | memoryview | None] = [self.writer.read(group_id, h) for h in hashes]
        ask = [i for i, d in enumerate(data) if d is None]
        if not ask:
            return data
        keys = self.keys.keys(group_id, hashes)
        values = self.guard.get([keys[i] for i in ask])
        layout = self.layouts[group_id]
        for i, value in zip(ask, values):
            try:
                data[i] = decode_block(layout, keys[i], value)
            except PayloadError as e:
                self._reject(group_id, keys[i], e)
        return data

    def _reject(self, group_id: int, key: bytes, error: PayloadError) -> None:
        self._stats.groups[group_id].rejected_blocks += 1
        self.guard.warn_once("rejected", f"kv store {self.store.describe()}: rejected a stored "
                                         f"block ({error}); it is recomputed and deleted")
        self.guard.delete([key])

    # ---- out: evicted (or computed) blocks to the store -------------------------------

    def before_step(self) -> None:
        """Copy out the blocks evicted since the last call and hand them to the
        writer. The engine calls this after scheduling, before the model step
        writes into the blocks the pool handed out (and the tier before it loads
        blocks into new ones): one copy per group per step."""
        recorder = self.recorder
        if recorder is None or not recorder.num_recorded:
            return
        # a few blocks go to a store without I/O straight from the pages
        inline = self.writer.inline_ok(recorder.num_recorded * self._max_block_bytes)
        batches = []
        for g, views in enumerate(self._host_views):
            hashes, ids = recorder.take(g)  # the chains' heads first
            if hashes and self.shared is not None:
                hashes, ids = self._not_written(g, hashes, ids)
            if not hashes:
                continue
            if inline and views is not None:
                self.writer.write_pages(g, hashes, ids, views)
            else:
                batches.append((g, hashes, self.pages.gather(g, np.frombuffer(ids, np.int64))))
        if batches:
            self.writer.submit_many(batches)

    def _not_written(self, group_id: int, hashes: list[bytes],
                     ids: bytes) -> tuple[list[bytes], bytes]:
        """Of evicted blocks, the ones shared writes did not write; noted as written."""
        shared = self.shared
        assert shared is not None
        keep = [i for i, h in enumerate(hashes) if not shared.is_written(group_id, h)]
        if len(keep) < len(hashes):
            shared.skipped_blocks += len(hashes) - len(keep)
            hashes = [hashes[i] for i in keep]
            ids = np.frombuffer(ids, np.int64)[keep].tobytes()
        shared.note_written(group_id, hashes)
        return hashes, ids

    def after_step(self) -> None:
        """Write-through: store the blocks cached since the last step (the step
        just computed them). Shared writes: queue the awaited blocks the step
        computed. Nothing to do in plain write-behind mode."""
        if self._computed:
            entries, self._computed = self._computed, []
            self._submit(entries)
        if self.shared is not None:
            self.shared.after_step()

    def _submit_ids(self, group_id: int, hashes: list[bytes], ids: list[int]) -> bool:
        """Copy a group's blocks out of the pages and queue them; False if dropped."""
        return self.writer.submit(group_id, hashes, self.pages.gather(group_id, ids))

    def _submit(self, entries: list[tuple[int, bytes, int]]) -> None:
        """Copy (group, hash, block id) blocks out of the pages; queue them."""
        by_group: dict[int, tuple[list[bytes], list[int]]] = {}
        for g, block_hash, block_id in entries:
            hashes, ids = by_group.setdefault(g, ([], []))
            hashes.append(block_hash)
            ids.append(block_id)
        self.writer.submit_many([(g, hashes, self.pages.gather(g, ids))
                                 for g, (hashes, ids) in by_group.items()])

    def _on_event(self, event: BlockEvent) -> None:
        if type(event) is BlockStored and not self._importing:
            self._computed.append((event.group_id, event.block_hash, event.block_id))

    def _on_written(self, group_id: int, num_blocks: int, num_bytes: int,
                    seconds: float) -> None:
        with self._lock:
            group = self._stats.groups[group_id]
            group.written_blocks += num_blocks
            group.written_bytes += num_bytes
            group.store_seconds += seconds
            self._stats.store_seconds += seconds

    # ---- admin -------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every block handed to the writer is in the store (or
        dropped), and make the store write out what it buffers. (Blocks evicted
        since the last `before_step` are not handed over yet.)"""
        done = self.writer.flush(timeout)
        self.guard.flush()
        return done

    def stats(self) -> KVStoreStats:
        """A snapshot of the counters, with the store's own (size, keys)."""
        with self._lock:
            out = self._stats.snapshot()
        groups = out.groups
        out.loaded_blocks = sum(s.loaded_blocks for s in groups)
        out.read_bytes = sum(s.read_bytes for s in groups)
        out.written_blocks = sum(s.written_blocks for s in groups)
        out.written_bytes = sum(s.written_bytes for s in groups)
        out.rejected_blocks = sum(s.rejected_blocks for s in groups)
        out.dropped_blocks = self.writer.dropped_blocks
        out.skipped_blocks = self.writer.skipped_blocks
        if self.shared is not None:
            out.shared_writes = True
            out.dropped_blocks += self.shared.dropped_blocks
            out.skipped_blocks += self.shared.skipped_blocks
        out.errors, out.skipped_calls = self.guard.errors, self.guard.skipped_calls
        out.available = self.guard.available
        out.store = self._store_stats()
        return out

    def _store_stats(self) -> StoreStats | None:
        if not self.guard.available:
            return None
        try:
            return self.store.stats()
        except Exception:  # noqa: BLE001 - stats are best effort
            return None

    def close(self) -> None:
        """Write what is queued, stop the writer, close the store."""
        self.writer.close()
        self.store.close()


def _layout_fields(layout: tuple[int, int, str]) -> tuple[str, int, int]:
    num_layers, layer_bytes, dtype = layout
    return dtype, num_layers, layer_bytes
