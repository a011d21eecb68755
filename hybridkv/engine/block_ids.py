"""Block ids of the running requests, converted once and kept across steps.

A request's block list changes only when it takes a new block or a window
releases some (about one step in `block_size` while decoding), but every
step needs the ids of every list. `BlockIdCache` keeps, per request and
group, the last list seen and its ids; a list equal to the last one (block
by block, compared by identity at C speed) reuses them.

Example: a decode step of 32 requests over 4 groups of 131 blocks compares
128 lists instead of reading 16,768 block ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hybridkv.core.block_pool import Block
from hybridkv.kv_cache_manager import KVCacheManager


class GroupIds(NamedTuple):
    """One request's block ids in one group: as a list and as int32 `[num_blocks]`."""

    ids: list[int]
    array: np.ndarray


class BlockIdCache:
    """Per-step block ids of a batch, reconverted only where a list changed."""

    def __init__(self) -> None:
        # request id -> per group: (copy of the block list, its ids)
        self._rows: dict[str, tuple[tuple[list[Block], GroupIds], ...]] = {}

    def block_ids(self, kv: KVCacheManager, request_ids: Sequence[str]) -> list[list[GroupIds]]:
        """Ids per group of each request, `[request][group]`, in `request_ids` order.

        Forgets requests not in `request_ids` (finished or preempted).
        """
        rows = {}
        for rid in request_ids:
            prev = self._rows.get(rid)
            groups = kv.get_blocks(rid).blocks
            if prev is None or len(prev) != len(groups):
                rows[rid] = tuple(_convert(blocks) for blocks in groups)
            else:
                rows[rid] = tuple(old if old[0] == blocks else _convert(blocks)
                                  for old, blocks in zip(prev, groups))
        self._rows = rows
        return [[ids for _, ids in rows[rid]] for rid in request_ids]


def _convert(blocks: list[Block]) -> tuple[list[Block], GroupIds]:
    ids = [b.block_id for b in blocks]
    return list(blocks), GroupIds(ids, np.array(ids, dtype=np.int32))
