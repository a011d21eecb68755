"""`hybrid`: the default policy, LRU with the groups' ratings taken into account.

Four rules decide which free block is taken next (docs/eviction.md states
each with the measurement that keeps it):

1. A block holding no cached data goes first (as under `lru`).
2. Then a cached block its group rated `LOW_VALUE` and no hit used: a window
   or a Mamba state no likely hit resumes from, worth as little as an empty
   block (vLLM's sparse window retention frees such blocks at once).
3. A block rated `PROTECTED` (it completes a prefix a running request still
   holds) goes only when nothing else is left; when that request ends its
   group rates it again and it queues with the request's release.
4. Every other block in `lru`'s order: least recently released or hit first,
   a request's blocks tail first. With no ratings this is `lru` exactly, so
   under flat popularity (every prefix as likely to come back) the policy is
   LRU, the best online order there.

A free block's rule is kept in `Block.queue_slot` (-1 when not free); each rule
holds its blocks in one queue, front first. `HybridQueues` is the pure-Python
reference; the C extension's `HybridCore` (`kv_cache/_fp_hybrid.c`) is the
same queues, decision for decision, and is the policy's base when built
(`HYBRIDKV_DISABLE_FASTPATH=1` runs the reference). Both read the ratings that
decide a queue from one named structure, `QUEUE_RATINGS`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from hybridkv.kv_cache.eviction.base import LOW_VALUE, PROTECTED, EvictionPolicy
from hybridkv.kv_cache.fastpath import native

if TYPE_CHECKING:
    from hybridkv.kv_cache.block_pool import Block

# the queues, in the order they are taken from (indexes into HybridPolicy._queues)
EMPTY, LOW, ORDERED, KEPT = range(4)


class QueueRatings(NamedTuple):
    """The ratings that send a block to a queue of its own (rules 2 and 3)."""

    low_value: int
    protected: int


QUEUE_RATINGS = QueueRatings(low_value=int(LOW_VALUE), protected=int(PROTECTED))


def queue_of(block: Block, ratings: QueueRatings = QUEUE_RATINGS) -> int:
    """The rule a released block falls under (the module docstring's numbering)."""
    if block.block_hash is None:
        return EMPTY
    rating = block.value_hint
    if rating == ratings.protected:
        return KEPT
    if rating == ratings.low_value and not block.num_hits:
        return LOW
    return ORDERED


class HybridQueues:
    """The policy's queues in Python: the reference the C `HybridCore` matches."""

    def __init__(self, blocks: Iterable[Block], ratings: QueueRatings) -> None:
        self._ratings = ratings
        self._queues: list[OrderedDict[Block, None]] = [OrderedDict() for _ in range(4)]
        empty = self._queues[EMPTY]
        for block in blocks:
            if block in empty:  # given twice: it keeps its first place
                continue
            empty[block] = None
            block.queue_slot = EMPTY
        self._num_free = len(empty)

    def __len__(self) -> int:
        return self._num_free

    def __iter__(self) -> Iterator[Block]:
        for queue in self._queues:
            yield from queue

    def __contains__(self, block: Block) -> bool:
        return block.queue_slot >= 0 and block in self._queues[block.queue_slot]

    def add_free(self, blocks: Iterable[Block]) -> None:
        queues, count = self._queues, 0
        for block in blocks:
            q = queue_of(block, self._ratings)
            block.queue_slot = q
            queues[q][block] = None
            if q == EMPTY:  # reused first, as `lru` does
                queues[q].move_to_end(block, last=False)
            count += 1
        self._num_free += count

    def remove(self, block: Block) -> None:
        del self._queues[block.queue_slot][block]
        block.queue_slot = -1
        self._num_free -= 1

    def remove_blocks(self, blocks: Sequence[Block]) -> None:
        queues = self._queues
        for block in blocks:
            del queues[block.queue_slot][block]
            block.queue_slot = -1
        self._num_free -= len(blocks)

    def take(self, num_blocks: int) -> list[Block]:
        out: list[Block] = []
        for queue in self._queues:
            pop = queue.popitem
            while queue and len(out) < num_blocks:
                out.append(pop(last=False)[0])
            if len(out) == num_blocks:
                break
        for block in out:
            block.queue_slot = -1
        self._num_free -= len(out)
        return out

    def uncache(self, block: Block) -> None:
        del self._queues[block.queue_slot][block]
        self._queues[EMPTY][block] = None
        self._queues[EMPTY].move_to_end(block, last=False)
        block.queue_slot = EMPTY

    def hint_changed(self, block: Block) -> None:
        """A new rating moves the block to its rule's queue, at the back (not a hit)."""
        q = queue_of(block, self._ratings)
        if q != block.queue_slot:
            del self._queues[block.queue_slot][block]
            block.queue_slot = q
            self._queues[q][block] = None


if TYPE_CHECKING:
    QueuesBase = HybridQueues
else:  # the C queues when built, else the Python reference
    QueuesBase = native.HybridCore if native is not None else HybridQueues


class HybridPolicy(QueuesBase, EvictionPolicy):
    """Empty blocks, then never-hit low-value blocks, then LRU, then protected blocks.

    >>> # free([a (LOW_VALUE), b]) then free([c (PROTECTED)]); take(3) -> [a, b, c]
    """

    uses_hints = True

    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        super().__init__(blocks, QUEUE_RATINGS)
