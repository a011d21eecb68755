"""The block pool: every KV cache block of every group, shared.

Block records are created once. Block 0 is the null block: never queued,
cached or counted; it stands wherever a group does not need a block. A block
is in exactly one of three states:

- held: ref_cnt > 0 (by requests, or pinned as a shared sink block);
- free and cached: ref_cnt == 0, in the free queue, reachable by its hash;
- free and empty: ref_cnt == 0, in the free queue, no hash.

`cached` maps (group id, block hash) -> block. Eviction is lazy: a cached
block stays findable while it sits in the free queue and is dropped from the
map only when it is taken for new data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from hybridkv.kv_cache.checks import check_int
from hybridkv.kv_cache.events import (
    AllBlocksCleared,
    BlockEvent,
    BlockRemoved,
    BlockStored,
    EventSubscriber,
)
from hybridkv.kv_cache.eviction import (
    NORMAL_VALUE,
    EvictionPolicy,
    Rating,
    make_eviction_policy,
)
from hybridkv.kv_cache.fastpath import native


class PyBlock:
    """One block record. `block_hash`/`group_id` are set while it caches data.

    The pure-Python reference of `_fastpath.Block`, which is `Block` when the
    C extension is built (same fields, read and written as attributes).
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash", "group_id", "num_hits", "value_hint",
                 "queue_slot", "num_children", "__weakref__")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.group_id = -1
        # eviction hints: prefix hits on the data since it was stored, and how the group
        # that released it rates its reuse; policies may use or ignore them
        self.num_hits = 0
        self.value_hint: Rating = NORMAL_VALUE
        self.queue_slot = -1  # for the eviction policy's own use (e.g. a tier)
        # blocks stored right after it in its group since it was stored (the
        # continuations of its data: more than one where prompts branch)
        self.num_children = 0

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"Block({self.block_id}, ref={self.ref_cnt}, hash={h})"


if TYPE_CHECKING:
    Block = PyBlock
elif native is not None:
    native.configure(NORMAL_VALUE)
    Block = native.Block
else:
    Block = PyBlock


class BlockPool:
    """Shared blocks, a free queue in eviction order, and the hash -> block map.

    Args:
        num_blocks: total blocks including the null block (>= 2).
        num_groups: KV cache groups keying cached blocks.
        eviction_policy: name of a registered policy (`lru` always exists).
        backend: the manager backend the policy runs under ("c", "python", or None
            for the default; `fastpath.resolve_backend`).
    """

    def __init__(self, num_blocks: int, num_groups: int = 1, *,
                 eviction_policy: str = "lru", backend: str | None = None) -> None:
        check_int("num_blocks", num_blocks, 2, note=" (the null block plus one)")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.free_queue: EvictionPolicy = make_eviction_policy(eviction_policy, self.blocks[1:],
                                                              backend)
        self.cached: list[dict[bytes, Block]] = [{} for _ in range(num_groups)]
        self.num_pinned = 0
        self.num_evictions = 0
        self.group_evictions = [0] * num_groups
        self._subscribers: list[EventSubscriber] = []
        self._stale_listeners: list[Callable[[list[int]], None]] = []
        self._evict_listeners: list[Callable[[list[Block]], None]] = []
        self._filter_evicted = False  # a listener wants cached blocks only

    # ---- queries -------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no holder (cached ones that can be evicted included)."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests or pinned."""
        return 1.0 - len(self.free_queue) / (self.num_blocks - 1)

    def get_cached_block(self, block_hash: bytes, group_id: int) -> Block | None:
        """The block caching `block_hash` for `group_id`, or None."""
        return self.cached[group_id].get(block_hash)

    def cached_block_getter(self, group_id: int) -> Callable[[bytes], Block | None]:
        """`get_cached_block` for one group as a plain function of the hash (for
        hit searches that look up many hashes; valid for the pool's life)."""
        return self.cached[group_id].get

    # ---- mutations -----------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[Block]:
        """Take `num_blocks` free blocks for new data, each with ref_cnt 1.

        Raises ValueError if fewer are free (callers check first).
        """
        if num_blocks > len(self.free_queue):
            raise ValueError(f"cannot take {num_blocks} blocks: only "
                             f"{len(self.free_queue)} are free")
        blocks = self.free_queue.take(num_blocks)
        assert len(blocks) == num_blocks, "the eviction policy returned too few blocks"
        if self._evict_listeners:
            self._notify_evict(blocks)
        evictions, normal, evicted = self.group_evictions, NORMAL_VALUE, 0
        for block in blocks:
            if block.block_hash is not None:
                evictions[block.group_id] += 1
                evicted += 1
                self._drop_hash(block)
            block.ref_cnt = 1
            block.num_hits = 0
            block.value_hint = normal
        self.num_evictions += evicted
        if self._stale_listeners:
            self._notify_stale(blocks)
        return blocks

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take one more reference on each block (a hit); free ones leave the queue.

        The null block is skipped.
        """
        null = self.null_block
        queued = []
        for block in blocks:
            ref_cnt = block.ref_cnt
            if not ref_cnt:
                if block is null:
                    continue
                queued.append(block)
            block.ref_cnt = ref_cnt + 1
            block.num_hits += 1
        if queued:
            self.free_queue.remove_blocks(queued)

    def hold(self, blocks: Iterable[Block]) -> None:
        """Take one more reference on each block without counting a hit (free
        ones leave the queue); `free_blocks` gives it back. The null block is
        skipped."""
        queued = []
        for block in blocks:
            if block is self.null_block:
                continue
            if not block.ref_cnt:
                queued.append(block)
            block.ref_cnt += 1
        if queued:
            self.free_queue.remove_blocks(queued)

    def free_blocks(self, blocks: Iterable[Block], requeue: Sequence[Block] = ()) -> None:
        """Drop one reference on each block, given in the order to evict them.

        Blocks whose count reaches 0 join the free queue (cached ones stay
        findable). The null block is skipped. `requeue`: free blocks whose rating
        changed, queued anew in the same release after those when the policy
        ranks by hints.
        """
        freed = []
        null = self.null_block
        for block in blocks:
            if block is null:
                continue
            ref_cnt = block.ref_cnt - 1
            block.ref_cnt = ref_cnt
            if not ref_cnt:
                freed.append(block)
        if requeue and self.free_queue.uses_hints:
            self.free_queue.remove_blocks(requeue)
            freed += requeue
        if freed:
            self.free_queue.add_free(freed)
            if self._stale_listeners:
                self._notify_stale([b for b in freed if b.block_hash is None])

    def cache_block(self, block: Block, block_hash: bytes, group_id: int) -> bool:
        """Make `block` findable by (`group_id`, `block_hash`).

        Returns False (and leaves the block uncached) when another block
        already caches that hash, or the block already caches other data.
        """
        if block.block_hash is not None:
            return block.block_hash == block_hash and block.group_id == group_id
        return self.cache_blocks((block,), (block_hash,), 0, 1, group_id) == 1

    def cache_blocks(self, blocks: Sequence[Block], block_hashes: Sequence[bytes], start: int,
                     end: int, group_id: int) -> int:
        """Make `blocks[i]` findable by (`group_id`, `block_hashes[i]`) for i in
        start..end-1; return how many became findable.

        Skipped: the null block, blocks already caching data, and blocks whose
        hash another block caches already (that one counts a use: the request
        recomputed data the cache held). A block stored counts as a child of the
        block caching the hash before it (`Block.num_children`).
        """
        table = self.cached[group_id]
        null, subscribers, stored = self.null_block, self._subscribers, 0
        evicted = self.free_queue.evicted  # data the policy watches for (usually none)
        for i in range(start, end):
            block = blocks[i]
            if block is null or block.block_hash is not None:
                continue
            block_hash = block_hashes[i]
            cached = table.get(block_hash)
            if cached is not None:
                self._note_recompute(cached)
                continue
            block.block_hash = block_hash
            block.group_id = group_id
            block.num_children = 0
            table[block_hash] = block
            stored += 1
            if i:  # one more continuation of the block before it
                parent: Block | None = blocks[i - 1]
                if parent is not None and parent.block_hash is None:
                    parent = table.get(block_hashes[i - 1])  # null, or a copy of cached data
                if parent is not None:
                    parent.num_children += 1
            if subscribers:
                self._emit(BlockStored(block_hash, group_id, block.block_id))
            if evicted and block_hash in evicted:
                self.free_queue.recomputed(block_hash)
        return stored

    def _note_recompute(self, block: Block) -> None:
        """A request computed data this block already caches (its hit stopped
        earlier, e.g. at a missing window): count it as a use of the block."""
        block.num_hits += 1
        if block.ref_cnt == 0:
            self.free_queue.hint_changed(block)

    def evict_blocks(self, block_ids: Iterable[int]) -> int:
        """Drop these blocks from the prefix cache; holders keep them.

        Returns how many blocks lost cached data. Ids outside the pool raise
        ValueError before anything changes.
        """
        ids = list(block_ids)
        for block_id in ids:
            check_int("evict_blocks: a block id", block_id, 0, self.num_blocks - 1)
        dropped = 0
        for block_id in ids:
            block = self.blocks[block_id]
            if block.block_hash is None:
                continue
            self._drop_hash(block)
            dropped += 1
            if block.ref_cnt == 0:
                self.free_queue.uncache(block)
        return dropped

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while any block is held
        by a request (pinned sink blocks do not count)."""
        if len(self.free_queue) + self.num_pinned != self.num_blocks - 1:
            return False
        for table in self.cached:
            for block in table.values():
                block.block_hash = None
                block.group_id = -1
                block.num_hits = 0
                block.value_hint = NORMAL_VALUE
                if block.ref_cnt == 0:  # an emptied block is reused before cached data
                    self.free_queue.uncache(block)
            table.clear()
        if self._subscribers:
            self._emit(AllBlocksCleared())
        return True

    def pin_blocks(self, num_blocks: int) -> list[Block]:
        """Take blocks that nothing frees or evicts (shared sink blocks)."""
        blocks = self.get_new_blocks(num_blocks)
        self.num_pinned += num_blocks
        return blocks

    # ---- events --------------------------------------------------------------

    def subscribe(self, callback: EventSubscriber) -> None:
        """Call `callback(event)` for every BlockStored/BlockRemoved/AllBlocksCleared."""
        self._subscribers.append(callback)

    def on_stale_blocks(self, callback: Callable[[list[int]], None]) -> None:
        """Call `callback(block_ids)` whenever blocks stop holding valid data: when
        they are taken for new data and when they are freed with nothing cached.

        A debug aid: an engine can poison those pages (e.g. fill them with NaN)
        so that a read of stale or unwritten KV shows up in the output.
        """
        self._stale_listeners.append(callback)

    def on_evict(self, callback: Callable[[list[Block]], None], *,
                 skips_empty: bool = False) -> None:
        """Call `callback(blocks)` with cached blocks taken for new data, before
        they lose their hash and rating: their pages still hold the data (a
        second tier copies it out here, or notes it to copy before the pages
        are next written). The blocks must not be changed. A callback that
        `skips_empty` may also get blocks that cached nothing (no hash), which
        spares the pool a filtering pass while it is the only kind listening."""
        self._evict_listeners.append(callback)
        self._filter_evicted = self._filter_evicted or not skips_empty

    def _notify_evict(self, blocks: list[Block]) -> None:
        evicted = [b for b in blocks if b.block_hash is not None] \
            if self._filter_evicted else blocks
        if evicted:
            for callback in self._evict_listeners:
                callback(evicted)

    def _notify_stale(self, blocks: list[Block]) -> None:
        if blocks:
            ids = [b.block_id for b in blocks]
            for callback in self._stale_listeners:
                callback(ids)

    def _emit(self, event: BlockEvent) -> None:
        for callback in self._subscribers:
            callback(event)

    def _drop_hash(self, block: Block) -> None:
        block_hash = block.block_hash
        assert block_hash is not None
        del self.cached[block.group_id][block_hash]
        if self._subscribers:
            self._emit(BlockRemoved(block_hash, block.group_id, block.block_id))
        block.block_hash = None
        block.group_id = -1

    # ---- invariants ----------------------------------------------------------

    def check_integrity(self, holders: Sequence[Block] = ()) -> None:
        """Assert the pool invariants.

        `holders` lists every reference requests hold (a block once per
        holder); when given, each block's ref count must equal it (plus one
        for pinned blocks, which the caller includes).
        """
        null = self.null_block
        assert null.ref_cnt == 0 and null.block_hash is None, "null block changed"
        assert null not in self.free_queue, "null block is queued"
        free = list(self.free_queue)
        assert len(free) == len(set(free)), "a block is queued twice"
        for block in free:
            assert block.ref_cnt == 0, f"{block} is free but held"
        num_held = sum(1 for b in self.blocks[1:] if b.ref_cnt > 0)
        assert num_held + len(free) == self.num_blocks - 1, "free + held != total"
        for group_id, table in enumerate(self.cached):
            for block_hash, block in table.items():
                assert block.block_hash == block_hash and block.group_id == group_id, \
                    f"map entry for {block} is stale"
        num_hashed = sum(1 for b in self.blocks if b.block_hash is not None)
        assert num_hashed == sum(map(len, self.cached)), "hashed block missing from map"
        if holders:
            counts: dict[int, int] = {}
            for block in holders:
                counts[block.block_id] = counts.get(block.block_id, 0) + 1
            for block in self.blocks[1:]:
                assert block.ref_cnt == counts.get(block.block_id, 0), \
                    f"{block} ref count != {counts.get(block.block_id, 0)} holders"
