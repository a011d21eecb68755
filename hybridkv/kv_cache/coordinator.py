"""The hybrid coordinator: one manager per KV cache group on one shared pool.

Everything here is a fan-out over the managers except `find_longest_cache_hit`,
the one hybrid algorithm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

from hybridkv.kv_cache.block_pool import Block, BlockPool
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.managers import SingleTypeManager, manager_class_for
from hybridkv.kv_cache.managers.base import UNLIMITED, Lookup
from hybridkv.kv_cache.request import Request

GroupBlocks = tuple[list[Block], ...]
Search = Callable[[Sequence[bytes], int], list[Block]]


class CacheHit(NamedTuple):
    """What `HybridCoordinator.find_longest_cache_hit` found."""

    blocks: GroupBlocks  # per group, the blocks of the first `length` tokens
    length: int  # tokens every group can reuse
    matched: int  # tokens the full-attention groups alone matched: the junction
    group_lengths: list[int]  # per group, what its own first search found (for stats)


class HybridCoordinator:
    """Managers of all groups, the hash block size and the hit alignment.

    Hashes are computed once at `hash_block_size` (the gcd of the groups'
    block sizes); hits are multiples of `alignment` (their lcm).
    """

    def __init__(self, config: KVCacheConfig, pool: BlockPool, enable_caching: bool) -> None:
        sizes = [g.kv_cache_spec.block_size for g in config.kv_cache_groups]
        self.hash_block_size = math.gcd(*sizes)
        self.alignment = math.lcm(*sizes)
        self.pool = pool
        self.managers: list[SingleTypeManager] = [
            manager_class_for(g.kv_cache_spec)(g.kv_cache_spec, i, pool, self.hash_block_size,
                                                enable_caching)
            for i, g in enumerate(config.kv_cache_groups)
        ]
        # full attention first: any prefix of its hit is a hit, so it is looked up once
        self._full_ids = [i for i, m in enumerate(self.managers) if m.downward_closed]
        self._other_ids = [i for i, m in enumerate(self.managers) if not m.downward_closed]
        for m in self.managers:  # the group whose blocks end a junction (`branches_at`)
            m.junction_group = self._full_ids[0] if self._full_ids else None
        # groups whose prepare() without a hit releases skipped blocks
        self._skipping = [m for m in self.managers if m.skips]
        self._pool_searches: list[Search] = [m.find_longest_cache_hit for m in self.managers]

    # ---- the hybrid algorithm ------------------------------------------------

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               lookups: Sequence[Lookup] | None = None) -> CacheHit:
        """Blocks of every group for the longest length all groups can reuse.

        Also returns the length the full-attention groups alone matched (where
        this prompt diverges from the cache) and, per group, the length its own
        first search found (what that group alone could reuse up to that match).

        The answer is the largest L <= `max_length`, multiple of the alignment,
        that every group accepts. Each group shrinks L to its own longest
        reusable length at or below L; this repeats until no group shrinks it.
        L only decreases and every common reusable length stays <= L, so the
        loop ends at the greatest common one.

        Example (B=4, window W=5 needs 1 block, full needs all): cached full
        blocks 0-3, window blocks 1 and 3, max_length 16. Full: L=16. Window:
        block 3 cached -> L=16, done: ([f0, f1, f2, f3], [null, null, null, w3]).
        With window block 3 evicted: window shrinks to L=8 (block 1), full
        accepts 8 -> ([f0, f1], [null, w1]).

        `lookups` (one per group) replace the pool's maps in the searches of
        managers that accept a lookup: a group's rule is then met by blocks
        found either way (the pool or a second tier's placeholders).
        """
        search = self._pool_searches if lookups is None else self._searches(lookups)
        align = self.alignment
        length = max_length // align * align
        hits: dict[int, list[Block]] = {}
        first_pass = [0] * len(self.managers)
        for i in self._full_ids:  # looked up once, trimmed at the end
            hit = search[i](block_hashes, length)
            hits[i] = hit
            first_pass[i] = len(hit) * self.managers[i].block_size
            length = min(length, first_pass[i]) // align * align
        matched = length
        others = self._other_ids
        for i in others:
            first_pass[i] = -1
        settled = not others
        while not settled and length > 0:
            settled = True
            for i in others:
                hit = search[i](block_hashes, length)
                found = len(hit) * self.managers[i].block_size // align * align
                hits[i] = hit
                if first_pass[i] < 0:
                    first_pass[i] = len(hit) * self.managers[i].block_size
                if found < length:
                    length, settled = found, False
        for i in others:
            if first_pass[i] < 0:  # not searched: the full-attention match was 0
                first_pass[i] = 0
        return CacheHit(self._trim(hits, length), length, matched, first_pass)

    def _searches(self, lookups: Sequence[Lookup]) -> list[Search]:
        """Per group: its search through `lookups[i]` where the manager takes one."""
        return [partial(m.find_longest_cache_hit, lookup=lookup)  # type: ignore[call-arg]
                if m.accepts_lookup
                else m.find_longest_cache_hit for m, lookup in zip(self.managers, lookups)]

    def _trim(self, hits: dict[int, list[Block]], length: int) -> GroupBlocks:
        out = []
        for i, manager in enumerate(self.managers):
            hit = hits.get(i, [])
            n = length // manager.block_size
            out.append(hit if len(hit) == n else hit[:n])
        return tuple(out)

    # ---- fan-out -------------------------------------------------------------

    def num_blocks_to_allocate(self, request: Request, num_computed_tokens: int,
                               num_tokens: int, hit: GroupBlocks | None, junction: int,
                               hashes: Callable[[], Sequence[bytes]] | None = None) -> int:
        """Net free-queue blocks all groups take (see SingleTypeManager).

        `junction`: the request's full-attention match at its last lookup;
        `hashes()`: the request's block hashes (None: caching is off, no cached
        block is shared)."""
        need = 0
        if hit is None:
            for m in self.managers:
                need += m.num_blocks_to_allocate(request, num_computed_tokens, num_tokens, None,
                                                 junction)
                if hashes is not None:
                    need -= m.num_shared_held(request, num_tokens, None, hashes)
            return need
        for m, h in zip(self.managers, hit):
            need += m.num_blocks_to_allocate(request, num_computed_tokens, num_tokens, h, junction)
            if hashes is not None:
                need -= m.num_shared_held(request, num_tokens, h, hashes)
        return need

    def allocate(self, request: Request, num_computed_tokens: int, num_tokens: int,
                 hit: GroupBlocks | None, junction: int, releases: bool = True,
                 hashes: Callable[[], Sequence[bytes]] | None = None) -> GroupBlocks:
        """Release skipped blocks or adopt the hit in every group, take the cached
        blocks of what is about to be recomputed (`shared_run`), then allocate.

        `releases=False`: the caller knows no group releases a block at
        `num_computed_tokens` (below the request's limits, see `cache_blocks`).
        """
        managers = self.managers
        if hit is None:
            for m in self._skipping if releases else ():
                m.remove_skipped_blocks(request, num_computed_tokens, junction)
        else:
            for m, h in zip(managers, hit):
                m.prepare(request, num_computed_tokens, h, junction)
        if hashes is not None:
            for m in managers:  # every group's shared blocks leave the queue before any eviction
                m.share(request, num_tokens, hashes)
        return tuple([m.allocate_new_blocks(request, num_computed_tokens, num_tokens)
                      for m in managers])

    def cache_blocks(self, request: Request, block_hashes: Callable[[], Sequence[bytes]] | None,
                     num_tokens: int) -> tuple[int, int]:
        """After `allocate`: cache the full blocks among the first `num_tokens`
        tokens (unless `block_hashes`, the request's hashes when called, is None).

        Returns the request's fast-path limits (max tokens, max computed
        tokens): up to them an allocation changes nothing in any group (see
        `SingleTypeManager.quiet_limits`)."""
        max_tokens = max_computed = UNLIMITED
        for m in self.managers:
            if block_hashes is not None:
                m.cache_blocks(request, block_hashes, num_tokens)
            tokens, computed = m.quiet_limits(request)
            if tokens < max_tokens:
                max_tokens = tokens
            if computed < max_computed:
                max_computed = computed
        return max_tokens, max_computed

    def num_releasable_retained(self) -> int:
        return sum(m.num_releasable_retained() for m in self.managers)

    def release_retained(self) -> None:
        for m in self.managers:
            m.release_retained()

    def free(self, request: Request, junction: int) -> None:
        for manager in self.managers:
            manager.free(request, junction)

    def get_blocks(self, request_id: str) -> GroupBlocks:
        return tuple(m.get_blocks(request_id) for m in self.managers)

    def max_blocks_held(self, num_tokens: int, max_chunk_tokens: int) -> int:
        return sum(m.max_blocks_held(num_tokens, max_chunk_tokens) for m in self.managers)

    def check_integrity(self) -> None:
        """Pool and group invariants; ref counts equal holders."""
        holders = [b for m in self.managers for b in m.holders()]
        holders += [b for m in self.managers for b in m.pinned_blocks()]
        self.pool.check_integrity(holders)
        for manager in self.managers:
            manager.check_integrity()
        if not holders:
            assert self.pool.num_free_blocks == self.pool.num_blocks - 1, "leaked blocks"
