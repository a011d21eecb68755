"""Which evicted blocks are worth a place in the store.

`hybrid` (default): every full-attention block (any prefix of a hit is a
hit, so the head of a chain is never useless); a sliding-window, chunked or
Mamba block only when a likely hit needs it: the group rated it above low
value when it was released (junctions, prompt and request ends, the Mamba
fallback grid, windows of the prompt's tail), or a hit stopping in the last
TAIL_TOKENS of some recent prompt needs it (where a question or a new turn
usually follows the shared part). A window block that only tokens long
passed needed is not stored: no later hit can use it without the blocks
after it.

`all`: every evicted block.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.eviction import LOW_VALUE
from hybridkv.kv_cache.managers.base import SingleTypeManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import ChunkedLocalAttentionSpec, KVCacheSpec, SlidingWindowSpec

SELECTIONS = ("hybrid", "all")
TAIL_TOKENS = 256
MAX_TAIL_HASHES = 1 << 18  # per group: the tail blocks of the most recent prompts


class RecentSet:
    """A set keeping about the `capacity` most recently added items (two
    generations: when the newer one fills, the older one is dropped)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(2, capacity)
        self._new: set[bytes] = set()
        self._old: set[bytes] = set()

    def update(self, items: Sequence[bytes]) -> None:
        self._new.update(items)
        if len(self._new) > self.capacity // 2:
            self._old, self._new = self._new, set()

    def __contains__(self, item: object) -> bool:
        return item in self._new or item in self._old


class Selection:
    """`worth_storing(block)` for the groups of one manager."""

    def __init__(self, managers: Sequence[SingleTypeManager], select: str = "hybrid") -> None:
        if select not in SELECTIONS:
            raise ValueError(f"kv store selection must be one of {SELECTIONS}, got {select!r}")
        self.managers = managers
        self.select = select
        # per group: whether every block is stored, and the tail blocks of recent prompts
        self.always = [select == "all" or m.downward_closed for m in managers]
        self.tails = [RecentSet(MAX_TAIL_HASHES) for _ in managers]

    def worth_storing(self, block: Block) -> bool:
        g = block.group_id
        return self.always[g] or block.value_hint != LOW_VALUE \
            or block.block_hash in self.tails[g]

    def note_prompt(self, request: Request, hashes: Sequence[bytes]) -> None:
        """Remember the blocks of each group that is not full attention which a
        hit stopping in the last TAIL_TOKENS of this prompt needs."""
        if self.select != "hybrid":
            return
        for g, m in enumerate(self.managers):
            if m.downward_closed:
                continue
            end = request.num_prompt_tokens // m.block_size
            start = max(0, end - TAIL_TOKENS // m.block_size - _reach_blocks(m.spec))
            self.tails[g].update(m.group_hashes(hashes, end)[start:end])


def _reach_blocks(spec: KVCacheSpec) -> int:
    """Blocks before a stop that a hit there needs, beyond the stop's own."""
    if isinstance(spec, SlidingWindowSpec):
        return spec.num_window_blocks
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return spec.attention_chunk_size // spec.block_size
    return 1
