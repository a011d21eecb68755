"""Protection: released blocks rated PROTECTED while their request runs.

A type that must return a block to the pool as soon as the request no longer
needs it (a sliding window, by its release rule) cannot hold it like
`Retention` does. When a likely hit needs that block with the prefix the
request still holds, the block is released rated `PROTECTED` instead: policies
that read ratings take it for new data last. When the request ends the block
gets back the rating it had (unless another running request protects it too,
or it was evicted meanwhile) and queues again with the request's release.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.eviction import JUNCTION, PROTECTED, Rating

if TYPE_CHECKING:
    from hybridkv.kv_cache.request import Request

# (request, junction, position, block) -> whether the released block is protected
ProtectRule = Callable[["Request", int, int, Block], bool]


class Protection:
    """Per request, the blocks it released rated PROTECTED, and per block how many
    running requests protect it.

    Args:
        protects: the type's rule (see `ProtectRule`).
    """

    def __init__(self, protects: ProtectRule) -> None:
        self.protects = protects
        # request id -> (block, its hash, the rating it had)
        self.records: dict[str, list[tuple[Block, bytes, Rating]]] = {}
        self.counts: dict[int, int] = {}  # block id -> requests protecting it

    def protect(self, request: Request, junction: int, blocks: list[Block], start: int,
                end: int, null: Block) -> None:
        """Rate PROTECTED the cached blocks among `blocks[start:end]` (about to be
        released) that the rule picks."""
        protects, counts = self.protects, self.counts
        record = None
        for i in range(start, end):
            block = blocks[i]
            if block is null or block.block_hash is None \
                    or not protects(request, junction, i, block):
                continue
            if record is None:
                record = self.records.setdefault(request.request_id, [])
            rating = block.value_hint
            record.append((block, block.block_hash,
                           JUNCTION if rating == PROTECTED else rating))
            block.value_hint = PROTECTED
            counts[block.block_id] = counts.get(block.block_id, 0) + 1

    def unprotect(self, request_id: str) -> list[Block]:
        """The request ends: its protected blocks get their rating back. Returns the
        free ones among them, tail first, to queue anew with its release."""
        protected = self.records.pop(request_id, None)
        if not protected:
            return []
        counts, requeue = self.counts, []
        for block, block_hash, rating in reversed(protected):
            n = counts.pop(block.block_id) - 1
            if n:
                counts[block.block_id] = n
            elif block.block_hash == block_hash and block.value_hint == PROTECTED:
                block.value_hint = rating
                if not block.ref_cnt:
                    requeue.append(block)
        return requeue

    def check_integrity(self, group_id: int) -> None:
        """Assert that the counts match the records."""
        protecting = Counter(b.block_id for record in self.records.values()
                             for b, _, _ in record)
        assert protecting == self.counts, f"protection counts in group {group_id}"
