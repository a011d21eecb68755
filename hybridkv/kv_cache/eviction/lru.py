"""`lru`: vLLM's order, exactly.

- a block holding no cached data is taken first;
- then the least recently used cached block, where "used" means released by
  its last holder or last hit;
- a request frees its blocks tail first, so the tail of a prefix is taken
  before its head.

Ratings (`Block.value_hint`) are ignored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from hybridkv.kv_cache.eviction.base import EvictionPolicy

if TYPE_CHECKING:
    from hybridkv.kv_cache.block_pool import Block


class LRUPolicy(EvictionPolicy):
    """Uncached blocks first, then least recently used; O(1) per operation.

    The queue is an insertion-ordered dict used as a doubly linked list: the
    front is taken first, freed cached blocks join at the back.

    >>> # free(A, B) with A uncached, B cached; take(1) -> [A]
    """

    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        self._queue: OrderedDict[Block, None] = OrderedDict.fromkeys(blocks)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Block]:
        return iter(self._queue)

    def __contains__(self, block: Block) -> bool:
        return block in self._queue

    def add_free(self, blocks: Iterable[Block]) -> None:
        queue = self._queue
        for block in blocks:
            queue[block] = None
            if block.block_hash is None:
                queue.move_to_end(block, last=False)

    def remove(self, block: Block) -> None:
        del self._queue[block]

    def remove_blocks(self, blocks: Sequence[Block]) -> None:
        queue = self._queue
        for block in blocks:
            del queue[block]

    def take(self, num_blocks: int) -> list[Block]:
        pop = self._queue.popitem
        return [pop(last=False)[0] for _ in range(num_blocks)]

    def uncache(self, block: Block) -> None:
        self._queue.move_to_end(block, last=False)
