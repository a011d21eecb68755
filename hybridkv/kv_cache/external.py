"""Blocks from a second tier: placeholders in hit searches, and imports into the pool.

A second tier (a KV store behind the pool) answers hit searches through
lookups that return `EXTERNAL` for a hash it holds: the hybrid fixed point
then treats the block as cached, and the hit it returns has `EXTERNAL` in
those positions. Before such a hit is used, its placeholders are imported:

1. `begin_import` holds the hit's pool blocks (so taking new blocks cannot
   evict them), then takes one new block per placeholder; None, with
   nothing changed, when the pool cannot supply them;
2. the caller writes each block's data into its new block;
3. `end_import` caches the blocks whose data arrived under their hash and
   gives every reference back. The pool now holds the hit, and the usual
   `get_computed_blocks` / `allocate_slots` path reuses it.

A placeholder block costs one free block in `num_blocks_to_allocate` (it
looks like an evictable cached block), which is exactly what importing it
takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from hybridkv.kv_cache.block_pool import Block, BlockPool

# stands for a block that a second tier holds and the pool does not
EXTERNAL = Block(-1)


class ImportSlot(NamedTuple):
    """One block to import: its group, its hash, and the pool block to fill."""

    group_id: int
    block_hash: bytes
    block: Block


class BlockImport:
    """An import in progress: pool blocks held for the hit, new blocks to fill."""

    __slots__ = ("held", "slots")

    def __init__(self, held: list[Block], slots: list[ImportSlot]) -> None:
        self.held = held
        self.slots = slots

    @property
    def block_ids(self) -> list[int]:
        return [slot.block.block_id for slot in self.slots]


def begin_import(pool: BlockPool, hit: Sequence[Sequence[Block]],
                 wanted: Sequence[tuple[int, bytes]]) -> BlockImport | None:
    """Hold the pool blocks of `hit` and take a new block per `(group id, hash)`.

    Returns None (nothing changed) when, after holding, fewer than
    `len(wanted)` blocks are free.
    """
    null = pool.null_block
    held = [b for group in hit for b in group if b is not null and b is not EXTERNAL]
    num_free_held = sum(1 for b in held if b.ref_cnt == 0)
    if len(wanted) > pool.num_free_blocks - num_free_held:
        return None
    pool.hold(held)
    blocks = pool.get_new_blocks(len(wanted)) if wanted else []
    slots = [ImportSlot(g, h, b) for (g, h), b in zip(wanted, blocks)]
    return BlockImport(held, slots)


def end_import(pool: BlockPool, imp: BlockImport, loaded: Sequence[bool]) -> int:
    """Cache the imported blocks whose data arrived (`loaded[i]`), then give
    back every reference `begin_import` took. Returns how many were cached.

    A block whose data did not arrive goes back to the pool empty.
    """
    cached = 0
    for slot, ok in zip(imp.slots, loaded):
        if ok and pool.cache_block(slot.block, slot.block_hash, slot.group_id):
            cached += 1
    # tail first, as a request releases its blocks; empty ones are reused first anyway
    pool.free_blocks([s.block for s in reversed(imp.slots)] + imp.held[::-1])
    return cached
