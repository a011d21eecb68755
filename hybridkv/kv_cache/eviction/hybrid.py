"""`hybrid`: retention-aware eviction for hybrid prefix caches.

Free blocks sit in tiers; a block is taken from the lowest non-empty tier:

0. blocks holding no cached data;
1. cached blocks their group rated low value when it released them
   (`Block.value_hint`: a sliding-window block outside every window a likely
   hit needs, a Mamba state at a boundary no likely hit stops at);
2. cached blocks never hit since they were stored, the most recently
   released request first (tail first within it). Data nobody reused yet
   goes before data that proved useful, and under cyclic access (round-robin
   sessions larger than the pool) the oldest sessions stay whole instead of
   each one being evicted just before its turn, as under LRU;
3. cached blocks hit once, least recently used first;
4. cached blocks hit twice or more, least recently used first;
5. cached blocks a running request still needs kept (`PROTECTED`: a window
   its group left behind that completes a prefix the request still holds),
   least recently released first; when the request ends its group rates
   them again and they move to their tier.

A block its group rated a junction (the window or state a hit needs where
requests sharing a prefix diverge) counts as hit once more: the full
prefix before it was just reused, and it completes that reusable unit.

Aging: every AGE_EVERY blocks taken for new data from tier 2 move the
least recently used block of tier 4 down to tier 3 and that of tier 3 to
the back of tier 2, so data that stops being hit drifts down and new popular
data can take its place (slowly: a burst of new data must not wash out what
is still being reused). A hit takes a block out of the queue; on release it
re-enters by its hit count.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from hybridkv.kv_cache.eviction.base import JUNCTION, LOW_VALUE, PROTECTED, EvictionPolicy

if TYPE_CHECKING:
    from hybridkv.kv_cache.block_pool import Block

# the tiers, in the order they are taken from (indexes into HybridPolicy._tiers)
EMPTY, LOW, FRESH, HIT_ONCE, HIT_OFTEN, KEPT = range(6)
AGE_EVERY = 8
# tiers kept as stacks (the end of the dict is taken first: new blocks go on top);
# the others are queues (the front is taken first, new blocks join at the end)
STACKS = (EMPTY, FRESH)


class HybridPolicy(EvictionPolicy):
    """Tiered free queue: empty, low value, fresh (newest first), hit once, hit often,
    kept for a running request.

    A free block's tier is kept in `Block.queue_slot` (-1 when not free).
    """

    uses_hints = True

    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        self._tiers: list[OrderedDict[Block, None]] = [OrderedDict() for _ in range(6)]
        self._num_taken = 0
        initial = list(blocks)
        for block in reversed(initial):  # a stack: the first given on top
            self._tiers[EMPTY][block] = None
            block.queue_slot = EMPTY
        self._num_free = len(initial)

    def __len__(self) -> int:
        return self._num_free

    def __iter__(self) -> Iterator[Block]:
        for t, tier in enumerate(self._tiers):
            yield from reversed(tier) if t in STACKS else tier

    def __contains__(self, block: Block) -> bool:
        return block.queue_slot >= 0 and block in self._tiers[block.queue_slot]

    def add_free(self, blocks: Iterable[Block]) -> None:
        fresh = []
        tiers = self._tiers
        empty, low = tiers[EMPTY], tiers[LOW]
        protected, low_value, junction = PROTECTED, LOW_VALUE, JUNCTION
        count = 0
        # a released block's tier: empty if it caches nothing; low if rated low value
        # and never hit (data that was hit proved its value whatever the rating);
        # else by hits, a junction rating counting as one more
        for block in blocks:
            count += 1
            if block.block_hash is None:
                block.queue_slot = EMPTY
                empty[block] = None
                continue
            hits, rating = block.num_hits, block.value_hint
            if rating == protected:
                block.queue_slot = KEPT
                tiers[KEPT][block] = None
                continue
            if rating == low_value and not hits:
                block.queue_slot = LOW
                low[block] = None
                continue
            t = hits + 1 if rating == junction else hits
            if not t:
                block.queue_slot = FRESH
                fresh.append(block)
            else:
                t = HIT_ONCE if t == 1 else HIT_OFTEN
                block.queue_slot = t
                tiers[t][block] = None
        self._num_free += count
        stack = tiers[FRESH]
        for block in reversed(fresh):  # the whole release goes first, its tail first
            stack[block] = None

    def remove(self, block: Block) -> None:
        del self._tiers[block.queue_slot][block]
        block.queue_slot = -1
        self._num_free -= 1

    def remove_blocks(self, blocks: Sequence[Block]) -> None:
        tiers = self._tiers
        for block in blocks:
            del tiers[block.queue_slot][block]
            block.queue_slot = -1
        self._num_free -= len(blocks)

    def take(self, num_blocks: int) -> list[Block]:
        tiers = self._tiers
        if num_blocks == 1:  # the common decode case
            for t, tier in enumerate(tiers):
                if tier:
                    block = tier.popitem(t in STACKS)[0]
                    block.queue_slot = -1
                    self._num_free -= 1
                    if t == FRESH:
                        self._num_taken += 1
                        if self._num_taken % AGE_EVERY == 0:
                            self._age()
                    return [block]
        out: list[Block] = []
        while len(out) < num_blocks:  # from the lowest non-empty tier (aging may refill one)
            t = next(i for i, tier in enumerate(tiers) if tier)
            pop, top = tiers[t].popitem, t in STACKS
            taken = [pop(top)[0] for _ in range(min(num_blocks - len(out), len(tiers[t])))]
            for block in taken:
                block.queue_slot = -1
            out += taken
            if t == FRESH:  # only evicting data counts: empty and low-value blocks are no loss
                before = self._num_taken
                self._num_taken += len(taken)
                for _ in range(self._num_taken // AGE_EVERY - before // AGE_EVERY):
                    self._age()
        self._num_free -= len(out)
        return out

    def _age(self) -> None:
        """Move the least recently used block of each hit tier one tier down."""
        tiers = self._tiers
        for t in (HIT_ONCE, HIT_OFTEN):
            if tiers[t]:
                block = tiers[t].popitem(last=False)[0]
                below = tiers[t - 1]
                below[block] = None  # the back of the tier below: taken last there
                if t - 1 in STACKS:
                    below.move_to_end(block, last=False)
                block.queue_slot = t - 1

    def hint_changed(self, block: Block) -> None:
        self.remove(block)
        self.add_free([block])

    def uncache(self, block: Block) -> None:
        del self._tiers[block.queue_slot][block]
        self._tiers[EMPTY][block] = None  # on top: reused first
        block.queue_slot = EMPTY
