"""The base every per-type manager extends.

A manager owns one KV cache group: each request's block list in token order
(the null block where the group does not need a block), the cache-hit search
of its attention type, and its rule for blocks a request no longer needs.
Allocation, freeing and caching of full blocks are written once here.

Hashes arrive at the hash block size (the gcd of all groups' block sizes);
a group whose block is `stride` hash blocks long keys block i by hash
`(i + 1) * stride - 1`, the hash of the last small block inside it.

A type that keeps skipped blocks for reuse composes a `Retention` (held until
the request ends) or a `Protection` (released rated PROTECTED) with its rule,
and may rate the blocks it releases (`rate_released`). Those rules read the
request's *junction*: how far its prompt matched cached full-attention blocks
at its last lookup, where later prompts sharing the prefix most likely diverge.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from itertools import chain
from typing import ClassVar

from hybridkv.kv_cache.block_pool import Block, BlockPool
from hybridkv.kv_cache.fastpath import UNLIMITED
from hybridkv.kv_cache.managers.protection import Protection
from hybridkv.kv_cache.managers.retention import Retention
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import KVCacheSpec

# finds the block caching a hash of one group (None: not cached)
Lookup = Callable[[bytes], "Block | None"]


def cached_run(get: Lookup, block_hashes: Sequence[bytes], stride: int, first: int,
               end: int) -> list[Block]:
    """The blocks `get` finds for block positions `first` .. `end - 1` (a group
    with `stride` hashes per block), up to the first position it does not."""
    run = []
    for i in range(first, end):
        block = get(block_hashes[(i + 1) * stride - 1])
        if block is None:
            break
        run.append(block)
    return run


class SingleTypeManager(ABC):
    """Block lists and reuse rules of one KV cache group.

    Subclasses implement `find_longest_cache_hit` and `num_skipped_blocks`;
    they may override allocation when their blocks are not one per token
    block (Mamba).
    """

    spec_class: ClassVar[type[KVCacheSpec]]
    # True when every prefix of a reusable length is reusable too (full attention):
    # the coordinator then looks the group up once and trims its hit.
    downward_closed: ClassVar[bool] = False
    # False when the type never releases blocks before the request ends
    skips: ClassVar[bool] = True
    # True when `find_longest_cache_hit` takes a `lookup` (searches beyond the pool)
    accepts_lookup: ClassVar[bool] = False
    # True when a request takes cached blocks for data it recomputes (`shared_run`)
    # instead of computing a second copy. Full attention only: its blocks are held
    # for the request's life. A window's or chunk's copy is released within the
    # window anyway, and taking the cached one out of the free queue would move it
    # (measured on the policy grid, docs/eviction.md).
    shares: ClassVar[bool] = False

    def __init__(self, spec: KVCacheSpec, group_id: int, pool: BlockPool,
                 hash_block_size: int, enable_caching: bool = True) -> None:
        if spec.block_size % hash_block_size:
            raise ValueError(f"block_size {spec.block_size} of group {group_id} is not a "
                             f"multiple of the hash block size {hash_block_size}")
        self.spec = spec
        self.block_size = spec.block_size
        self.group_id = group_id
        self.pool = pool
        self.null_block = pool.null_block
        # hash -> the block caching it in this group, or None (for hit searches)
        self.cached_block = pool.cached_block_getter(group_id)
        self.stride = spec.block_size // hash_block_size
        self.enable_caching = enable_caching
        self.req_to_blocks: dict[str, list[Block]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.num_skipped: dict[str, int] = {}
        # leading blocks never released by skipping (sink blocks)
        self.num_kept_head_blocks = 0
        # set by types that keep skipped blocks for reuse (see the module docstring)
        self.retention: Retention | None = None
        self.protection: Protection | None = None
        # the full-attention group whose match is the junction (set by the
        # coordinator; None without one): `branches_at` reads its blocks
        self.junction_group: int | None = None

    # ---- the type's rules ----------------------------------------------------

    @abstractmethod
    def find_longest_cache_hit(self, block_hashes: Sequence[bytes],
                               max_length: int) -> list[Block]:
        """Cached blocks for the longest reusable length <= `max_length`.

        The length is `len(result) * block_size`; positions this type does
        not need hold the null block, e.g. `[null, null, b7, b8]`. A query:
        changes nothing.

        Managers that set `accepts_lookup` take a third argument `lookup`: a
        function used instead of `cached_block` to find the block of a hash
        (a second tier answers with a placeholder block).
        """

    @abstractmethod
    def num_skipped_blocks(self, request: Request, num_computed_tokens: int) -> int:
        """Leading block positions the request no longer needs once
        `num_computed_tokens` tokens are computed (never decreases)."""

    # ---- helpers for hit searches ----------------------------------------------

    def group_hashes(self, block_hashes: Sequence[bytes], num_blocks: int) -> Sequence[bytes]:
        """This group's first `num_blocks` block hashes."""
        if self.stride == 1:
            return block_hashes[:num_blocks]
        s = self.stride
        return block_hashes[s - 1:num_blocks * s:s]

    # ---- check ---------------------------------------------------------------

    def num_blocks_to_allocate(self, request: Request, num_computed_tokens: int,
                               num_tokens: int, hit: Sequence[Block] | None,
                               junction: int) -> int:
        """Net blocks `allocate` takes from the free queue to cover `num_tokens`.

        New blocks, plus hit blocks sitting in the free queue (touching them
        removes them), minus blocks that skipping returns to it. `hit` is
        only given for a request that holds no blocks yet; then
        `num_computed_tokens` includes it. `junction`: see the module docstring.
        """
        if hit:
            return max(-(-num_tokens // self.block_size) - len(hit), 0) + self.num_evictable(hit)
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return -(-num_tokens // self.block_size)
        need = -(-num_tokens // self.block_size) - len(blocks)
        if need < 0:
            need = 0
        if self.skips:
            need -= self._num_freed_by_skip(request, blocks, num_computed_tokens, junction)
        return need

    def shared_run(self, request: Request, first: int, num_tokens: int,
                   hashes: Callable[[], Sequence[bytes]]) -> list[Block]:
        """The cached blocks of positions `first`, `first + 1`, ... up to the
        blocks `num_tokens` need (full blocks of the request's known tokens),
        stopping at the first position not cached: data the request is about
        to compute that the cache holds already. `share` takes them instead of
        new blocks (one copy of the data, not two). `hashes()`: the request's
        hashes, called only when there is a position to look up."""
        if not self.shares:
            return []
        end = min(-(-num_tokens // self.block_size),
                  len(request.all_token_ids) // self.block_size)
        if end <= first:
            return []
        block_hashes = hashes()
        return cached_run(self.cached_block, block_hashes, self.stride, first,
                          min(end, len(block_hashes) // self.stride))

    def num_shared_held(self, request: Request, num_tokens: int, hit: Sequence[Block] | None,
                        hashes: Callable[[], Sequence[bytes]]) -> int:
        """How many of the blocks `share` would take are held by other requests:
        counted as new blocks by `num_blocks_to_allocate`, they take nothing
        from the free queue."""
        if not self.shares:
            return 0
        first = len(hit) if hit else len(self.req_to_blocks.get(request.request_id) or ())
        return sum(1 for b in self.shared_run(request, first, num_tokens, hashes) if b.ref_cnt)

    def num_evictable(self, blocks: Sequence[Block]) -> int:
        """How many of these blocks sit in the free queue (touching them removes them)."""
        null = self.null_block
        return [b.ref_cnt for b in blocks if b is not null].count(0)

    def _num_freed_by_skip(self, request: Request, blocks: list[Block],
                           num_computed_tokens: int, junction: int) -> int:
        start = self.num_skipped.get(request.request_id, self.num_kept_head_blocks)
        end = min(self.num_skipped_blocks(request, num_computed_tokens), len(blocks))
        if end <= start:
            return 0
        null, freed = self.null_block, 0
        if self.retention is not None:
            for block in self.retention.split(request, junction, blocks, start, end)[0]:
                if block.ref_cnt == 1:
                    freed += 1
            return freed
        for i in range(start, end):
            block = blocks[i]
            if block.ref_cnt == 1 and block is not null:
                freed += 1
        return freed

    # ---- commit --------------------------------------------------------------

    def prepare(self, request: Request, num_computed_tokens: int,
                hit: Sequence[Block] | None, junction: int) -> None:
        """First half of an allocation: adopt `hit`, or release skipped blocks.

        The coordinator runs this for every group before any group takes new
        blocks, so blocks one group releases can serve another.
        """
        if hit:
            self.save_new_computed_blocks(request, hit)
        elif self.skips:
            self.remove_skipped_blocks(request, num_computed_tokens, junction)

    def remove_skipped_blocks(self, request: Request, num_computed_tokens: int,
                              junction: int) -> None:
        """Return blocks the request no longer needs; their positions become null.

        They stay cached (reusable by others) until evicted. Those the type's
        retention keeps stay held for the request until it ends.
        """
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return
        rid = request.request_id
        start = self.num_skipped.get(rid, self.num_kept_head_blocks)
        end = min(self.num_skipped_blocks(request, num_computed_tokens), len(blocks))
        if end <= start:
            return
        null = self.null_block
        self.rate_released(request, junction, blocks, start, end)
        if self.protection is not None:
            self.protection.protect(request, junction, blocks, start, end, null)
        if self.retention is None:
            released = [b for b in blocks[start:end] if b is not null]
        else:
            released, retained = self.retention.split(request, junction, blocks, start, end)
            if retained:
                self.retention.keep(rid, retained)
        blocks[start:end] = [null] * (end - start)
        self.num_skipped[rid] = end
        released.reverse()
        self.pool.free_blocks(released)

    def save_new_computed_blocks(self, request: Request, blocks: Sequence[Block]) -> None:
        """Adopt hit blocks for a request that holds none yet (touches them)."""
        rid = request.request_id
        assert not self.req_to_blocks.get(rid), f"{rid} already holds blocks"
        self.pool.touch(blocks)
        self.req_to_blocks[rid] = list(blocks)
        self.num_cached_blocks[rid] = len(blocks)

    def share(self, request: Request, num_tokens: int,
              hashes: Callable[[], Sequence[bytes]]) -> None:
        """Take (touch) the cached blocks `shared_run` finds for the positions
        about to be computed. The coordinator runs this for every group before
        any group takes new blocks, so no eviction takes them first."""
        if not self.shares:
            return
        blocks = self.req_to_blocks.get(request.request_id)
        run = self.shared_run(request, len(blocks) if blocks else 0, num_tokens, hashes)
        if run:
            self.pool.touch(run)
            if blocks is None:
                blocks = self.req_to_blocks[request.request_id] = []
            blocks.extend(run)

    def allocate_new_blocks(self, request: Request, num_computed_tokens: int,
                            num_tokens: int) -> list[Block]:
        """Give the request blocks for `num_tokens` tokens; return the new ones."""
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks is None:
            blocks = self.req_to_blocks[request.request_id] = []
        need = -(-num_tokens // self.block_size) - len(blocks)
        if need <= 0:
            return []
        new_blocks = self.pool.get_new_blocks(need)
        blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, block_hashes: Callable[[], Sequence[bytes]],
                     num_tokens: int) -> None:
        """Make the request's full blocks among the first `num_tokens` tokens reusable.

        `block_hashes()` gives the request's hashes; it is called only when a
        block is to be cached (hashing is lazy)."""
        rid = request.request_id
        num_full = num_tokens // self.block_size
        start = self.num_cached_blocks.get(rid, 0)
        if num_full <= start:
            return
        hashes = block_hashes()
        num_full = min(num_full, len(hashes) // self.stride)
        if num_full <= start:
            return
        blocks = self.req_to_blocks[rid]
        # this group's keys: the hash list itself when blocks are hash-sized
        group = hashes if self.stride == 1 else self.group_hashes(hashes, num_full)
        self.pool.cache_blocks(blocks, group, start, num_full, self.group_id)
        self.num_cached_blocks[rid] = num_full

    def free(self, request: Request, junction: int) -> None:
        """Return all the request's blocks, tail first, then the retained ones
        (so they are taken after the prefix they complete). Idempotent."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, None)
        self.num_cached_blocks.pop(rid, None)
        retained = self.retention.pop(rid) if self.retention is not None else ()
        requeue = self.protection.unprotect(rid) if self.protection is not None else ()
        if blocks:
            self.rate_released(request, junction, blocks, 0, len(blocks))
        if blocks or retained or requeue:
            self.pool.free_blocks(chain(reversed(blocks or ()), reversed(retained)), requeue)
        self.num_skipped.pop(rid, None)

    # ---- retention -----------------------------------------------------------

    def retained(self, request_id: str) -> list[Block]:
        """Blocks held for the request that its list no longer shows."""
        return self.retention.held(request_id) if self.retention is not None else []

    def num_releasable_retained(self) -> int:
        """How many blocks `release_retained` would return to the free queue."""
        return self.retention.num_releasable() if self.retention is not None else 0

    def release_retained(self) -> None:
        """Return every request's retained blocks (they stay cached)."""
        if self.retention is not None:
            self.retention.release_all()

    # ---- retention hints -------------------------------------------------------

    def rate_released(self, request: Request, junction: int,  # noqa: B027
                      blocks: list[Block], start: int, end: int) -> None:
        """Rate blocks `start:end` about to be released (`Block.value_hint`), so
        retention-aware eviction drops dead weight first and keeps junctions.

        Likely hits stop at anchors: the junction (other requests diverge
        there), the prompt end (`request.num_prompt_tokens`), and the
        request's end when it finishes (`request.num_computed_tokens`). Full
        attention needs every block before an anchor, so it rates nothing.
        """

    def branches_at(self, request: Request, junction: int) -> bool:
        """Whether prompts branch at the request's junction: the full-attention block
        ending there has had a continuation stored besides the request's own (two
        children or more, `Block.num_children`), so other prompts diverge there.
        Where the cached data simply ended (the previous step of an agent, the
        previous turn of a chat), the request's own continuation is the only one and
        later prompts pass through. True when it cannot tell (no full-attention
        group, no hashes, or that block no longer cached)."""
        hasher = getattr(request, "hasher", None)
        if self.junction_group is None or hasher is None or junction <= 0 \
                or hasher.block_size * self.stride != self.block_size:  # hashed otherwise
            return True
        i = junction // hasher.block_size - 1
        hashes = hasher.hashes
        if i >= len(hashes):
            return True
        block = self.pool.get_cached_block(hashes[i], self.junction_group)
        return block is None or block.num_children >= 2

    # ---- fast path -----------------------------------------------------------

    def quiet_limits(self, request: Request) -> tuple[int, int]:
        """(max tokens, max computed tokens) up to which an allocation for this
        request would change nothing in this group: no new block, no block to
        cache, no block to release. Lets the manager skip the full path."""
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        if not blocks:
            return 0, 0
        max_tokens = len(blocks) * self.block_size
        if self.enable_caching:
            next_full = (self.num_cached_blocks.get(rid, 0) + 1) * self.block_size - 1
            if next_full < max_tokens:
                max_tokens = next_full
        if not self.skips:
            return max_tokens, UNLIMITED
        return max_tokens, self.max_quiet_computed(request)

    def max_quiet_computed(self, request: Request) -> int:
        """Largest computed-token count that releases no block yet.

        A search over the monotone `num_skipped_blocks`; the built-in types
        override it with a closed form.
        """
        if not self.skips:
            return UNLIMITED
        start = self.num_skipped.get(request.request_id, self.num_kept_head_blocks)
        hi = max(request.num_computed_tokens, 1)
        while self.num_skipped_blocks(request, hi) <= start and hi < 1 << 40:
            hi *= 2
        lo = 0  # num_skipped_blocks(0) == 0 <= start
        while lo < hi:  # largest c with num_skipped_blocks(c) <= start
            mid = (lo + hi + 1) // 2
            if self.num_skipped_blocks(request, mid) <= start:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ---- views ---------------------------------------------------------------

    def get_blocks(self, request_id: str) -> list[Block]:
        return self.req_to_blocks.get(request_id, [])

    def max_blocks_held(self, num_tokens: int, max_chunk_tokens: int) -> int:
        """Most blocks one request can hold while computing `num_tokens`
        tokens in chunks of at most `max_chunk_tokens` (with no hit)."""
        return -(-num_tokens // self.block_size)

    def pinned_blocks(self) -> Sequence[Block]:
        """Blocks the group itself holds for its whole life (shared sink blocks)."""
        return ()

    def holders(self) -> list[Block]:
        """Every block reference the requests of this group hold."""
        null = self.null_block
        held = [b for blocks in self.req_to_blocks.values() for b in blocks if b is not null]
        for rid in self.req_to_blocks:
            held += self.retained(rid)
        return held

    def check_integrity(self) -> None:
        """Assert this group's invariants (one holder per block per request)."""
        for rid, blocks in self.req_to_blocks.items():
            retained = self.retained(rid)
            ids = [b.block_id for b in chain(blocks, retained) if b is not self.null_block]
            assert len(ids) == len(set(ids)), f"{rid} holds a block twice in group {self.group_id}"
            for b in chain(blocks, retained):
                assert b is self.null_block or b.ref_cnt > 0, f"{rid} holds free {b}"
            start = self.num_skipped.get(rid, self.num_kept_head_blocks)
            assert all(b is self.null_block for b in blocks[self.num_kept_head_blocks:start]), \
                f"{rid} keeps a skipped block in group {self.group_id}"
        if self.protection is not None:
            self.protection.check_integrity(self.group_id)
