"""Sliding-window attention, with optional StreamingLLM-style sink tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from hybridkv.kv_cache.block_pool import Block, BlockPool
from hybridkv.kv_cache.eviction import JUNCTION, LOW_VALUE, NORMAL_VALUE
from hybridkv.kv_cache.managers.base import Lookup, SingleTypeManager
from hybridkv.kv_cache.managers.protection import Protection
from hybridkv.kv_cache.managers.tail_margin import TailMargin
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import SlidingWindowSpec


class SlidingWindowManager(SingleTypeManager):
    """A token at position p sees positions p-W+1 .. p (and the first S sink tokens).

    Reusable at L when the last `min(L/B, ceil((W-1)/B))` blocks before L are
    cached, and with S sink tokens also the first `min(L/B, ceil(S/B))`.
    The search goes right to left for the rightmost run of cached blocks
    long enough; a hit holds only those (and the sink blocks):
    `[null, null, b7, b8]` for W=8, B=4, L=16.

    Blocks the window leaves behind go back to the pool at once; those a
    likely hit needs are rated PROTECTED until the request ends (`protects`),
    the others rated by `rate_released`.
    """

    spec_class = SlidingWindowSpec
    accepts_lookup = True
    spec: SlidingWindowSpec
    # prompts often end in a unique suffix (a question, a new turn) after the part
    # later prompts share: keep the windows of stops at most this close before the
    # prompt end, closer when the requests that branch show shorter suffixes
    # (`TailMargin`; measured: docs/eviction.md, "Why the tail margin")
    tail_margin_tokens: ClassVar[int] = 192
    tail_history: ClassVar[int] = 64  # the branching requests the margin is learned from

    def __init__(self, spec: SlidingWindowSpec, group_id: int, pool: BlockPool,
                 hash_block_size: int, enable_caching: bool = True) -> None:
        super().__init__(spec, group_id, pool, hash_block_size, enable_caching)
        self.num_kept_head_blocks = spec.num_sink_blocks
        self.protection = Protection(self.protects)
        self.tail_margin = TailMargin(self.tail_margin_tokens, self.tail_history)

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               lookup: Lookup | None = None) -> list[Block]:
        spec, stride = self.spec, self.stride
        num_blocks = min(max_length // self.block_size, len(block_hashes) // stride)
        get = lookup or self.cached_block
        sinks: list[Block] = []
        for i in range(min(spec.num_sink_blocks, num_blocks)):
            block = get(block_hashes[(i + 1) * stride - 1])
            if block is None:
                num_blocks = i  # L may not pass a missing sink block
                break
            sinks.append(block)
        return self._search_window(block_hashes, num_blocks, sinks, get)

    def _search_window(self, block_hashes: Sequence[bytes], num_blocks: int,
                       sinks: list[Block], get: Lookup) -> list[Block]:
        """The rightmost run of `num_window_blocks` cached blocks ending at or
        before `num_blocks` (or a run from block 0), with the sinks in front."""
        need, stride, null = self.spec.num_window_blocks, self.stride, self.null_block
        if need == 0:
            return sinks + [null] * (num_blocks - len(sinks))
        if num_blocks >= need:  # the common case: the last window is cached
            last = list(map(get, block_hashes[(num_blocks - need + 1) * stride - 1:
                                              num_blocks * stride:stride]))
            if all(last):  # no None (a block is always true)
                start = num_blocks - need
                return sinks[:start] + [null] * (start - min(start, len(sinks))) + last  # type: ignore
        run: list[Block] = []  # cached blocks ending at `end`, rightmost first
        end = num_blocks
        for i in range(num_blocks - 1, -1, -1):
            block = get(block_hashes[(i + 1) * stride - 1])
            if block is None:
                run.clear()
                end = i
                continue
            run.append(block)
            if len(run) == need:
                break
        start = end - len(run)
        if not run or (len(run) < need and start != 0):
            return []
        run.reverse()
        head = sinks[:start] + [null] * (start - min(start, len(sinks)))
        return head + run

    def num_skipped_blocks(self, request: Request, num_computed_tokens: int) -> int:
        first_needed = num_computed_tokens - self.spec.sliding_window + 1
        return max(first_needed, 0) // self.block_size

    def protects(self, request: Request, junction: int, i: int, block: Block) -> bool:
        """A block the window left behind is protected until the request ends when
        its hit used it, or it is in the window of the junction or of a stop in the
        prompt's tail: released for good while the request still holds the
        full-attention prefix before it, it would be evicted first and strand that
        prefix."""
        if block.num_hits:
            return True
        bs, need = self.block_size, self.spec.num_window_blocks
        shared = junction // bs
        if shared - need <= i < shared:
            return True
        prompts = request.num_prompt_tokens
        return self.tail_margin.first_stop(prompts, bs) - need <= i < prompts // bs

    def learn_tail(self, request: Request, junction: int) -> None:
        """Show the tail margin how far before its prompt end the request branched
        off cached data, where it did (`branches_at`). Mutates `tail_margin`."""
        tail = max(0, request.num_prompt_tokens - junction)
        if junction > 0 and self.tail_margin.counts(request.request_id, tail) \
                and self.branches_at(request, junction):
            self.tail_margin.observe(request.request_id, tail)

    def rate_released(self, request: Request, junction: int, blocks: list[Block], start: int,
                      end: int) -> None:
        """The window of the junction is rated a junction when it is short next to the
        prefix it completes (at most half of it): a window as long as the prefix would
        rank as many blocks as the prefix above it, and the pool would give up the prefix
        first and keep the window stranded. And only where prompts branch
        (`branches_at`): where the cached data simply ended there (an agent's or a
        chat's previous step), the next step passes through it and needs the window at
        this request's end instead. The windows of stops in the prompt's tail (the last
        `tail_margin.tokens` tokens, learned from the requests that branch: `learn_tail`)
        keep their rating; the rest is low value (the window of the request's end too: a next
        turn that resumes there finds the prompt end's window a few blocks before).

        Kept blocks before the junction that no hit used were recomputed while the
        full-attention blocks of their positions were cached (taken by `share`, which
        counts a hit on them): they count that hit too. Left never hit, they would go
        before the prefix blocks they complete, and the next prompt on the prefix
        would stop at the same point again."""
        self.learn_tail(request, junction)
        bs, need, null = self.block_size, self.spec.num_window_blocks, self.null_block
        shared = junction // bs
        j_lo = shared - need  # the window of the junction: rated a junction
        at_junction = JUNCTION if 2 * need <= shared and start < shared and end > j_lo \
            and self.branches_at(request, junction) else NORMAL_VALUE
        prompt = request.num_prompt_tokens // bs
        # kept as they are: the windows of the stops in the prompt's tail (which hold
        # the prompt end's); the rest is low value
        t_lo = self.tail_margin.first_stop(request.num_prompt_tokens, bs) - need
        # positions between the kept head (sink blocks) and the skipped ones are null
        head = min(end, self.num_kept_head_blocks)
        skipped = self.num_skipped.get(request.request_id, head)
        for lo, hi in ((start, head), (max(start, skipped, head), end)):
            for i in range(lo, hi):
                block = blocks[i]
                if block is null:
                    continue
                if j_lo <= i < shared:
                    block.value_hint = at_junction
                elif not t_lo <= i < prompt:
                    block.value_hint = LOW_VALUE
                if i < shared and not block.num_hits and block.value_hint != LOW_VALUE:
                    block.num_hits = 1  # recomputed with the prefix: as hit as its blocks

    def check_integrity(self) -> None:
        super().check_integrity()
        self.tail_margin.check_integrity()

    def max_quiet_computed(self, request: Request) -> int:
        # (c - W + 1) // B <= start  <=>  c <= (start + 1) * B + W - 2
        start = self.num_skipped.get(request.request_id, self.num_kept_head_blocks)
        return (start + 1) * self.block_size + self.spec.sliding_window - 2

    def max_blocks_held(self, num_tokens: int, max_chunk_tokens: int) -> int:
        window = self.spec.sliding_window - 1 + min(num_tokens, max_chunk_tokens)
        return min(-(-num_tokens // self.block_size),
                   self.spec.num_sink_blocks + window // self.block_size + 2)
