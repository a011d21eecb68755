"""Block events: what entered and left the prefix cache, for observers and routers.

Events carry block hashes and group ids only (never a cache salt or tokens),
so a router can learn which prefixes an instance holds without learning
whose they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """A block of group `group_id` now caches data keyed by `block_hash`."""

    block_hash: bytes
    group_id: int
    block_id: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """The block that cached `block_hash` for `group_id` no longer does."""

    block_hash: bytes
    group_id: int
    block_id: int


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was emptied."""


BlockEvent = BlockStored | BlockRemoved | AllBlocksCleared
EventSubscriber = Callable[[BlockEvent], None]
