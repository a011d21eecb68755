"""Retention: blocks a request no longer needs that it keeps held until it ends.

Data a likely hit needs together with a prefix the request still holds (a
Mamba state where later prompts stop matching) must not go back to the pool
while that prefix stays held: released early, it would be evicted first and
leave the prefix cached but unusable. A manager whose type may do this owns a
`Retention`; its rule splits the blocks skipping takes off a request's list
into those released at once and those retained. Retained blocks are released
after the request's own blocks when it ends, or all at once when the pool
could not otherwise serve a running request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hybridkv.kv_cache.block_pool import Block, BlockPool

if TYPE_CHECKING:
    from hybridkv.kv_cache.request import Request

# (request, junction, blocks, start, end) -> (released, retained): the non-null blocks
# blocks[start:end], split by the type's retention rule
SplitRule = Callable[["Request", int, list[Block], int, int], tuple[list[Block], list[Block]]]


class Retention:
    """Per request, the blocks skipping took off its list that it still holds.

    Args:
        pool: the pool the blocks go back to.
        split: the type's rule (see `SplitRule`); it must depend only on the
            request, the junction and the blocks (it is checked, then applied).
    """

    def __init__(self, pool: BlockPool, split: SplitRule) -> None:
        self.pool = pool
        self.split = split
        self.blocks: dict[str, list[Block]] = {}

    def keep(self, request_id: str, blocks: list[Block]) -> None:
        """Hold these blocks (already referenced) for the request until it ends."""
        self.blocks.setdefault(request_id, []).extend(blocks)

    def held(self, request_id: str) -> list[Block]:
        """Blocks held for the request that its list no longer shows."""
        return self.blocks.get(request_id, [])

    def pop(self, request_id: str) -> list[Block]:
        """Forget the request's retained blocks (it ends); the caller releases them."""
        return self.blocks.pop(request_id, [])

    def num_releasable(self) -> int:
        """How many blocks `release_all` would return to the free queue."""
        return sum(1 for held in self.blocks.values() for b in held if b.ref_cnt == 1)

    def release_all(self) -> None:
        """Return every request's retained blocks (they stay cached): the pool
        could not otherwise supply a running request's allocation."""
        blocks = [b for held in self.blocks.values() for b in reversed(held)]
        self.blocks.clear()
        self.pool.free_blocks(blocks)
