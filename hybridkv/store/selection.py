"""Which evicted blocks are worth a place in the store.

`hybrid` (default): every full-attention block (any prefix of a hit is a
hit, so no block of a chain is useless); a sliding-window, chunked or Mamba
block only when a likely hit needs it: the group rated it above low value
when it was released (windows and states at junctions, prompt and request
ends, the Mamba fallback grid; a sliding-window group also keeps the windows
of its prompt's last 256 tokens), or it is a Mamba state in the last
TAIL_TOKENS of a recent prompt (where a question or a new turn usually
follows the shared part). A window block that a long prompt merely passed
is left out: no hit can use it without the blocks after it.

`all`: every evicted block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.eviction import LOW_VALUE
from hybridkv.kv_cache.managers.base import SingleTypeManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from hybridkv.store.codec import native

SELECTIONS = ("hybrid", "all")
TAIL_TOKENS = 256
MAX_TAIL_HASHES = 1 << 18  # per group: the tail blocks of the most recent prompts


class RecentSet:
    """A set keeping about the `capacity` most recently added items (two
    generations: when the newer one fills, the older one is dropped)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(2, capacity)
        # the two generations, the newer at `_new`; the set objects stay the same
        # (`sets` may be handed out once and read for the set's life)
        self.sets: tuple[set[bytes], set[bytes]] = (set(), set())
        self._new = 0

    def update(self, items: Sequence[bytes]) -> None:
        new = self.sets[self._new]
        new.update(items)
        if len(new) > self.capacity // 2:
            self._new = 1 - self._new
            self.sets[self._new].clear()

    def __contains__(self, item: object) -> bool:
        return item in self.sets[0] or item in self.sets[1]


def new_tail_set(capacity: int) -> Any:
    """A RecentSet of block hashes: `_codec.TailSet` (64-bit fingerprints in C, a
    few MB however many hashes) or, without the C module, `RecentSet`."""
    tail_set = native("TailSet")
    return tail_set(capacity) if tail_set is not None else RecentSet(capacity)


class Selection:
    """`worth_storing(block)` for the groups of one manager."""

    def __init__(self, managers: Sequence[SingleTypeManager], select: str = "hybrid") -> None:
        if select not in SELECTIONS:
            raise ValueError(f"kv store selection must be one of {SELECTIONS}, got {select!r}")
        self.managers = managers
        self.select = select
        # per group: whether every block is stored, and the tail blocks of recent prompts
        self.always = [select == "all" or m.downward_closed for m in managers]
        # (group, manager, blocks before a prompt's end to remember) of the groups whose
        # own ratings do not keep a prompt's tail, and their memory of recent tails
        self._noted = [(g, m, TAIL_TOKENS // m.block_size + _reach_blocks(m.spec))
                       for g, m in enumerate(managers)
                       if select == "hybrid" and not self.always[g]
                       and isinstance(m.spec, MambaSpec)]
        noted = {g for g, _, _ in self._noted}
        self.notes_prompts = bool(noted)  # (whether `note_prompt` does anything)
        self.tails: list[Any] = [new_tail_set(MAX_TAIL_HASHES) if g in noted else None
                                 for g in range(len(managers))]

    def worth_storing(self, block: Block) -> bool:
        g = block.group_id
        tails = self.tails[g]
        return self.always[g] or block.value_hint != LOW_VALUE \
            or (tails is not None and block.block_hash in tails)

    def tails_for_recorder(self) -> list[Any]:
        """Per group, what the eviction recorder checks a block's hash against."""
        return [t.sets if isinstance(t, RecentSet) else t for t in self.tails]

    def note_prompt(self, request: Request, hashes: Sequence[bytes]) -> None:
        """Remember the blocks a hit stopping in the last TAIL_TOKENS of this
        prompt needs, in the groups whose own ratings do not keep them (Mamba
        rates states between its anchors low; a sliding-window group already
        keeps the windows of its prompt's tail, a chunked group rates nothing)."""
        for g, m, tail in self._noted:
            end = request.num_prompt_tokens // m.block_size
            stride = m.stride  # (the group's block i is hash (i + 1) * stride - 1)
            self.tails[g].update(hashes[(max(0, end - tail) + 1) * stride - 1:end * stride:stride])


def _reach_blocks(spec: KVCacheSpec) -> int:
    """Blocks before a stop that a hit there needs, beyond the stop's own."""
    if isinstance(spec, SlidingWindowSpec):
        return spec.num_window_blocks
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return spec.attention_chunk_size // spec.block_size
    return 1
