"""Eviction policies: the free-block queue of the pool, in eviction order.

A policy holds every block with no holder (ref count 0) except the null
block, and decides which one is taken next when new data needs a block. The
pool tells it when blocks are freed, taken back by a hit (`remove`), or lose
their cached data (`uncache`). `lru` is always available:

- a block holding no cached data is taken first;
- then the least recently used cached block, where "used" means released by
  its last holder or last hit;
- a request frees its blocks tail first, so the tail of a prefix is taken
  before its head.

Policies are picked by name from `EVICTION_POLICIES`, a registry users can
extend with `register_eviction_policy`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybridkv.kv_cache.block_pool import Block


class EvictionPolicy(ABC):
    """The set of free blocks and the order they are taken in.

    Constructed with the pool's initially free blocks (all uncached).
    """

    # True for a policy that ranks by the hints (`num_hits`, `value_hint`): when a
    # request ends, the free blocks its groups rated again are then removed and
    # given to `add_free` again with its release (after its blocks)
    uses_hints: bool = False

    @abstractmethod
    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        """Start with `blocks` free, taken in the order given."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of free blocks."""

    @abstractmethod
    def __iter__(self) -> Iterator[Block]:
        """Free blocks, the next one to be taken first."""

    @abstractmethod
    def __contains__(self, block: Block) -> bool:
        """True if `block` is free."""

    @abstractmethod
    def add_free(self, blocks: Iterable[Block]) -> None:
        """Blocks whose last holder let go, in the order they should be evicted."""

    @abstractmethod
    def remove(self, block: Block) -> None:
        """A free block got a holder again (a cache hit)."""

    def remove_blocks(self, blocks: Sequence[Block]) -> None:
        """`remove` for each of these free blocks (a hit on several at once)."""
        for block in blocks:
            self.remove(block)

    @abstractmethod
    def take(self, num_blocks: int) -> list[Block]:
        """Remove and return the next `num_blocks` blocks to reuse (caller checked the count)."""

    @abstractmethod
    def uncache(self, block: Block) -> None:
        """A free block lost its cached data: it becomes the first to reuse."""

    def hint_changed(self, block: Block) -> None:  # noqa: B027 - optional hook
        """A free block's eviction hints (`num_hits`, `value_hint`) changed.

        Policies that rank by hints re-rank it; LRU ignores hints.
        """


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


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {"lru": LRUPolicy}
# the default: retention-aware tiers (hybridkv.kv_cache.eviction.hybrid); it keeps
# far more reuse under memory pressure (round-robin sessions, hybrid groups)
DEFAULT_EVICTION_POLICY = "hybrid"


def register_eviction_policy(name: str, policy_class: type[EvictionPolicy]) -> None:
    """Make `policy_class` available as `eviction_policy=name`."""
    if not (isinstance(policy_class, type) and issubclass(policy_class, EvictionPolicy)):
        raise ValueError(f"eviction policy {name!r} must subclass EvictionPolicy")
    EVICTION_POLICIES[name] = policy_class


def make_eviction_policy(name: str, blocks: Iterable[Block]) -> EvictionPolicy:
    """The policy registered as `name`, holding `blocks` as free; ValueError if unknown."""
    from hybridkv.kv_cache.eviction import hybrid as hybrid_eviction  # noqa: F401  registers "hybrid"

    if name not in EVICTION_POLICIES:
        raise ValueError(f"eviction_policy: unknown policy {name!r}; "
                         f"use one of {sorted(EVICTION_POLICIES)}")
    return EVICTION_POLICIES[name](blocks)
