"""What every eviction policy is: the free-block queue of the pool, in eviction order,
and the ratings groups give the blocks they release.

A policy holds every block with no holder (ref count 0) except the null
block, and decides which one is taken next when new data needs a block. The
pool tells it when blocks are freed, taken back by a hit (`remove`), or lose
their cached data (`uncache`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import IntEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybridkv.kv_cache.block_pool import Block


class Rating(IntEnum):
    """How the group that releases a block rates its reuse (`Block.value_hint`).

    Policies may use or ignore it (`lru` ignores it).
    """

    LOW_VALUE = 0  # no likely future hit needs the block
    NORMAL_VALUE = 1  # no opinion (the rating of every block taken for new data)
    JUNCTION = 2  # a hit where requests sharing a prefix diverge needs it
    PROTECTED = 3  # a running request still holds the prefix a hit would need it with;
    #               rated again when that request ends


LOW_VALUE = Rating.LOW_VALUE
NORMAL_VALUE = Rating.NORMAL_VALUE
JUNCTION = Rating.JUNCTION
PROTECTED = Rating.PROTECTED


class EvictionPolicy(ABC):
    """The set of free blocks and the order they are taken in.

    Constructed with the pool's initially free blocks (all uncached).
    """

    # True for a policy that ranks by the hints (`num_hits`, `value_hint`): when a
    # request ends, the free blocks its groups rated again are then removed (still
    # unheld: `ref_cnt` 0, unlike a hit) and given to `add_free` again with its
    # release (after its blocks)
    uses_hints: bool = False
    # hashes of evicted data the policy wants to hear about when it is computed and
    # cached again (`recomputed`); empty for policies that do not watch
    evicted: Mapping[bytes, object] = MappingProxyType({})

    @classmethod
    def for_backend(cls, backend: str) -> type[EvictionPolicy]:
        """The class that runs this policy under the manager backend `backend` ("c" or
        "python"): the class itself, unless the policy has a C twin."""
        return cls

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

    def recomputed(self, block_hash: bytes) -> None:  # noqa: B027 - optional hook
        """Data whose hash is in `evicted` was computed and cached again."""

    def hint_changed(self, block: Block) -> None:  # noqa: B027 - optional hook
        """A free block's eviction hints (`num_hits`, `value_hint`) changed.

        Policies that rank by hints re-rank it; LRU ignores hints.
        """
