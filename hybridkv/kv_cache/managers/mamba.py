"""Mamba (SSM) layers: one live state per request plus block-boundary checkpoints.

A request's list for a Mamba group has `floor(n / B) + 1` entries for `n`
allocated tokens. The last entry is the live block: the running state, the
same physical block for the request's whole life. Entry j < last is either
null or a checkpoint: the block that receives (or, right after a hit,
supplies) the state after the first `(j + 1) * B` tokens. Checkpoints are
hashed like attention blocks, so a later request with the same first
`(j + 1) * B` tokens can start from that state; once the request's computed
tokens pass them they leave its list (null).

Which boundaries get a checkpoint is the retention policy: every
`checkpoint_interval`-th boundary, plus the last boundary inside the prompt.

Checkpoints that leave the list go back to the pool (still reusable), except
the states a later hit most likely stops at within the prompt: the junction
(where the prompt's full-attention match ended), the prompt end, the
`prime_interval` grid, and the state the request's own hit started from. The
manager keeps those (cached) states held for the request until it ends
(its `Retention`, rule `split_skipped`), so they are released, and aged, together with the
full-attention prefix they complete instead of before it: released early,
they would be evicted while the prefix stays cached, leaving it unusable
(stranded). A request thus holds its live block, the checkpoints of the step
being computed and about one state per `prime_interval` prompt blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from hybridkv.kv_cache.block_pool import Block, BlockPool
from hybridkv.kv_cache.eviction import JUNCTION, LOW_VALUE
from hybridkv.kv_cache.managers.base import Lookup, SingleTypeManager
from hybridkv.kv_cache.managers.retention import Retention
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import MambaSpec


class MambaManager(SingleTypeManager):
    """Reusable at L when L = 0 or the state at boundary L is cached.

    The search goes right to left for the last cached state; a hit is
    `[null, ..., null, state_block]` (the state block is copied into the
    request's live block before its first step).
    """

    spec_class = MambaSpec
    accepts_lookup = True
    spec: MambaSpec
    # states every `prime_interval` boundaries are kept as fallbacks for hits that
    # stop between anchors; the rest are flagged low value when released
    prime_interval: ClassVar[int] = 16

    def __init__(self, spec: MambaSpec, group_id: int, pool: BlockPool,
                 hash_block_size: int, enable_caching: bool = True) -> None:
        super().__init__(spec, group_id, pool, hash_block_size, enable_caching)
        self.retention = Retention(pool, self.split_skipped)

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               lookup: Lookup | None = None) -> list[Block]:
        stride = self.stride
        num_blocks = min(max_length // self.block_size, len(block_hashes) // stride)
        get = lookup or self.cached_block
        for i in range(num_blocks - 1, -1, -1):
            block = get(block_hashes[(i + 1) * stride - 1])
            if block is not None:
                return [self.null_block] * i + [block]
        return []

    def num_skipped_blocks(self, request: Request, num_computed_tokens: int) -> int:
        # every checkpoint at or before the computed tokens has been written
        return num_computed_tokens // self.block_size

    def checkpoint_boundaries(self, request: Request, num_computed_tokens: int,
                              num_tokens: int) -> list[int]:
        """Boundary indices j (state after j*B tokens) to checkpoint in
        (num_computed_tokens, num_tokens], per the retention policy."""
        if not self.enable_caching:
            return []
        bs, every = self.block_size, self.spec.checkpoint_interval
        first, last = num_computed_tokens // bs + 1, num_tokens // bs
        if every == 1:
            return list(range(first, last + 1))
        prompt_end = request.num_prompt_tokens // bs
        return [j for j in range(first, last + 1) if j % every == 0 or j == prompt_end]

    def num_blocks_to_allocate(self, request: Request, num_computed_tokens: int,
                               num_tokens: int, hit: Sequence[Block] | None,
                               junction: int) -> int:
        num_ckpt = len(self.checkpoint_boundaries(request, num_computed_tokens, num_tokens))
        if hit:
            return 1 + num_ckpt + self.num_evictable(hit)  # a new live block
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return 1 + num_ckpt
        freed = self._num_freed_by_skip(request, blocks, num_computed_tokens, junction)
        return int(self._live_block(blocks, num_computed_tokens) is None) + num_ckpt - freed

    def allocate_new_blocks(self, request: Request, num_computed_tokens: int,
                            num_tokens: int) -> list[Block]:
        rid = request.request_id
        blocks = self.req_to_blocks.setdefault(rid, [])
        null = self.null_block
        live = self._live_block(blocks, num_computed_tokens)
        boundaries = self.checkpoint_boundaries(request, num_computed_tokens, num_tokens)
        if not boundaries and live is not None:  # no new block: the live one may move
            grow = num_tokens // self.block_size + 1 - len(blocks)
            if grow > 0:
                blocks[-1] = null
                blocks.extend([null] * grow)
                blocks[-1] = live
            return []
        new_blocks = self.pool.get_new_blocks(len(boundaries) + (live is None))
        if live is None:
            live = new_blocks[-1]
        else:
            blocks[-1] = null
        blocks.extend([null] * (num_tokens // self.block_size + 1 - len(blocks)))
        for j, block in zip(boundaries, new_blocks):
            blocks[j - 1] = block
        blocks[-1] = live
        return new_blocks

    def _live_block(self, blocks: list[Block], num_computed_tokens: int) -> Block | None:
        """The request's live block, if it has one yet (not right after a hit)."""
        if blocks and len(blocks) > num_computed_tokens // self.block_size:
            return blocks[-1]
        return None

    def quiet_limits(self, request: Request) -> tuple[int, int]:
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return 0, 0
        # one more token past the live block's span moves the live block
        return len(blocks) * self.block_size - 1, self.max_quiet_computed(request)

    def split_skipped(self, request: Request, junction: int, blocks: list[Block], start: int,
                      end: int) -> tuple[list[Block], list[Block]]:
        """The retention rule: the non-null blocks `start:end` as (released,
        retained). The state at boundary i + 1 (block i) stays held until the
        request ends when it is cached and the request's hit started from it, or
        it is within the prompt at the junction, the prompt end or the grid."""
        bs, grid, null = self.block_size, self.prime_interval, self.null_block
        prompt_end = request.num_prompt_tokens // bs
        junction //= bs
        released: list[Block] = []
        retained: list[Block] = []
        for i in range(start, end):
            block = blocks[i]
            if block is null:
                continue
            j = i + 1
            if block.block_hash is not None and (block.num_hits or j <= prompt_end and (
                    j == prompt_end or j % grid == 0 or j == junction)):
                retained.append(block)
            else:
                released.append(block)
        return released, retained

    def rate_released(self, request: Request, junction: int, blocks: list[Block], start: int,
                      end: int) -> None:
        bs, grid, null = self.block_size, self.prime_interval, self.null_block
        junction //= bs
        ends = (junction, request.num_prompt_tokens // bs, request.num_computed_tokens // bs)
        for i in range(start, min(end, len(blocks) - 1)):  # the live block caches nothing
            block = blocks[i]
            if block is null:
                continue
            if i + 1 == junction:
                block.value_hint = JUNCTION
            elif (i + 1) % grid and i + 1 not in ends:
                block.value_hint = LOW_VALUE
            else:  # one block completes a whole reusable prefix: protect it like a hit one
                block.value_hint = JUNCTION

    def max_quiet_computed(self, request: Request) -> int:
        # c // B <= start  <=>  c <= (start + 1) * B - 1
        return (self.num_skipped.get(request.request_id, 0) + 1) * self.block_size - 1

    def max_blocks_held(self, num_tokens: int, max_chunk_tokens: int) -> int:
        # live + the step's checkpoints (retained states are given up when short)
        return min(num_tokens, max_chunk_tokens) // self.block_size + 2


class MambaStatePlan(NamedTuple):
    """Where a Mamba layer reads and writes state for one request in one step."""

    live_block_id: int
    source_block_id: int | None  # read the initial state here (a hit), else from live
    checkpoints: list[tuple[int, int]]  # (tokens processed in this step, block id) to write


def mamba_state_plan(block_ids: Sequence[int], num_computed_tokens: int, num_new_tokens: int,
                     block_size: int, null_block_id: int = 0) -> MambaStatePlan:
    """Read a Mamba group's block ids as the runner's instructions.

    >>> mamba_state_plan([0, 9, 4, 7], 8, 6, 4)  # hit at 8: start from 9, save after 4 more
    MambaStatePlan(live_block_id=7, source_block_id=9, checkpoints=[(4, 4)])
    """
    source = None
    if num_computed_tokens and num_computed_tokens % block_size == 0:
        candidate = block_ids[num_computed_tokens // block_size - 1]
        if candidate != null_block_id:
            source = candidate
    checkpoints = []
    for j in range(num_computed_tokens // block_size, len(block_ids) - 1):
        block_id = block_ids[j]
        if block_id != null_block_id:
            checkpoints.append(((j + 1) * block_size - num_computed_tokens, block_id))
    return MambaStatePlan(block_ids[-1], source, checkpoints)
