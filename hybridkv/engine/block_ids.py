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

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager


class GroupIds(NamedTuple):
    """One request's block ids in one group: as a list and as int32 `[num_blocks]`."""

    ids: list[int]
    array: np.ndarray


class BlockIdCache:
    """Per-step block ids of a batch, reconverted only where a list changed."""

    def __init__(self) -> None:
        # request id -> (copies of its block lists, their ids), one entry per group
        self._rows: dict[str, tuple[tuple[list[Block], ...], list[GroupIds]]] = {}

    def block_ids(self, kv: KVCacheManager, request_ids: Sequence[str]) -> list[list[GroupIds]]:
        """Ids per group of each request, `[request][group]`, in `request_ids` order.

        Forgets requests not in `request_ids` (finished or preempted).
        """
        rows = {}
        for rid in request_ids:
            groups = kv.get_blocks(rid).blocks
            prev = self._rows.get(rid)
            if prev is None or prev[0] != groups:  # tuple of lists: compared block by block
                prev = _convert(groups, prev)
            rows[rid] = prev
        self._rows = rows
        return [rows[rid][1] for rid in request_ids]


def _convert(groups: tuple[list[Block], ...], prev: tuple | None
             ) -> tuple[tuple[list[Block], ...], list[GroupIds]]:
    """Copies of `groups` and their ids, reusing the ids of the lists equal to `prev`'s."""
    old_lists, old_ids = prev if prev is not None else ((), [])
    ids = [old_ids[g] if g < len(old_lists) and old_lists[g] == blocks else _ids(blocks)
           for g, blocks in enumerate(groups)]
    return tuple(list(blocks) for blocks in groups), ids


def _ids(blocks: list[Block]) -> GroupIds:
    ids = [b.block_id for b in blocks]
    return GroupIds(ids, np.array(ids, dtype=np.int32))
