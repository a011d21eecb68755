"""Full attention: a token attends to every earlier token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.managers.base import Lookup, SingleTypeManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import FullAttentionSpec, KVCacheSpec


class FullAttentionManager(SingleTypeManager):
    """Reusable at L when blocks 0 .. L/B-1 are all cached; never skips a block.

    The search goes left to right and stops at the first miss, so any prefix
    of a hit is a hit too (the reusable set is downward closed).
    """

    spec_class: ClassVar[type[KVCacheSpec]] = FullAttentionSpec
    downward_closed = True
    accepts_lookup = True
    skips = False
    shares = True

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               lookup: Lookup | None = None) -> list[Block]:
        get = lookup or self.cached_block
        hit: list[Block] = []
        for block_hash in self.group_hashes(block_hashes, max_length // self.block_size):
            block = get(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    def num_skipped_blocks(self, request: Request, num_computed_tokens: int) -> int:
        return 0
