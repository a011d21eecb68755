"""KVCacheManager: the scheduler's only door to the KV cache.

Which blocks a request holds in every group, which of its tokens are already
computed (prefix cache hits), and what becomes reusable. Check, then commit:
`allocate_slots` first works out how many blocks every group needs, returns
None when the pool can't supply them yet (ValueError when it never could), and
only then changes anything.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from hybridkv.kv_cache import fastpath
from hybridkv.kv_cache.block_pool import Block, BlockPool
from hybridkv.kv_cache.checks import check_int
from hybridkv.kv_cache.coordinator import GroupBlocks, HybridCoordinator
from hybridkv.kv_cache.events import EventSubscriber
from hybridkv.kv_cache.eviction import DEFAULT_EVICTION_POLICY
from hybridkv.kv_cache.external import BlockImport, begin_import, end_import
from hybridkv.kv_cache.fastpath import native
from hybridkv.kv_cache.hashing import check_hash_algo
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.managers import (
    ChunkedLocalAttentionManager,
    FullAttentionManager,
    MambaManager,
    MambaStatePlan,
    SinkFullAttentionManager,
    SlidingWindowManager,
    mamba_state_plan,
)
from hybridkv.kv_cache.managers.base import Lookup
from hybridkv.kv_cache.prefix_cache_stats import REPEATED_MISS_WARNING, PrefixCacheStats
from hybridkv.kv_cache.request import Request

# the manager types the C paths know, exactly (a subclass may change any rule)
NATIVE_KINDS = {FullAttentionManager: fastpath.KIND_FULL,
                SinkFullAttentionManager: fastpath.KIND_FULL,
                SlidingWindowManager: fastpath.KIND_SLIDING,
                ChunkedLocalAttentionManager: fastpath.KIND_CHUNKED,
                MambaManager: fastpath.KIND_MAMBA}


if TYPE_CHECKING:
    BlocksBase = fastpath.BlocksCore
else:  # the C extension's type when loaded (either backend takes it), else the reference
    BlocksBase = native.BlocksCore if native is not None else fastpath.BlocksCore
_Held = fastpath.Held  # what a backend tracks a held request with (its own type in C)


class KVCacheBlocks(BlocksBase):
    """Blocks per group, as returned by `get_computed_blocks` and `allocate_slots`."""

    __slots__ = ()
    blocks: GroupBlocks

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.get_block_ids()})"


class KVCacheManager:
    """Prefix-cached KV blocks for every group of a (hybrid) model on one pool.

    Args:
        kv_cache_config: the groups and the pool size.
        enable_caching: reuse blocks across requests (prefix caching).
        hash_algo: "sha256" (default) or "xxhash".
        eviction_policy: a registered policy name: "hybrid" (default,
            retention-aware: five rules, see hybridkv.kv_cache.eviction.hybrid)
            or "lru" (vLLM's LRU order, see hybridkv.kv_cache.eviction.lru).
        warn_repeated_misses: issue one RuntimeWarning (per manager) the first
            time a prompt start has been looked up `REPEATED_MISS_WARNING` times
            and found nothing reusable each time: the pool may be too small for
            the working set. Counted in `prefix_cache_stats` either way.
        backend: what runs the hot paths: "c" (the C extension), "python" (its
            pure-Python reference, same decisions) or None (C when built and not
            disabled by HYBRIDKV_DISABLE_FASTPATH=1). Held in `self._core`.
    """

    def __init__(self, kv_cache_config: KVCacheConfig, *, enable_caching: bool = True,
                 hash_algo: str = "sha256", eviction_policy: str = DEFAULT_EVICTION_POLICY,
                 warn_repeated_misses: bool = True, backend: str | None = None) -> None:
        if not isinstance(kv_cache_config, KVCacheConfig):
            raise ValueError(f"kv_cache_config must be a KVCacheConfig, "
                             f"got {type(kv_cache_config).__name__}")
        self.backend = fastpath.resolve_backend(backend)
        self.hash_algo = check_hash_algo(hash_algo)
        self.enable_caching = bool(enable_caching)
        self.config = kv_cache_config
        self.pool = BlockPool(kv_cache_config.num_blocks, len(kv_cache_config.kv_cache_groups),
                              eviction_policy=eviction_policy, backend=self.backend)
        self.coordinator = HybridCoordinator(kv_cache_config, self.pool, self.enable_caching)
        self.hash_block_size = self.coordinator.hash_block_size
        self.num_groups = len(kv_cache_config.kv_cache_groups)
        self._stats = PrefixCacheStats(group_hits=[0] * self.num_groups)
        # requests holding blocks, by id
        self._held: dict[str, _Held] = {}
        # the full-attention match of each request's last lookup (its junction), kept
        # for requests that hold no blocks yet (or again, after a preemption)
        self._junctions: weakref.WeakKeyDictionary[Request, int] = weakref.WeakKeyDictionary()
        self._no_blocks = KVCacheBlocks(tuple([] for _ in range(self.num_groups)))
        self._missed_prefixes: dict[bytes, int] = {}
        self._warned = not warn_repeated_misses
        self._core, self._held_type = fastpath.new_core(self.backend)
        groups = [(m, NATIVE_KINDS.get(type(m), fastpath.KIND_OTHER))
                  for m in self.coordinator.managers]
        self._core.bind(self, Request, KVCacheBlocks, self.pool, groups,
                        self.coordinator.alignment, self.enable_caching)
        # a decode step's call runs the backend's method itself, with no frame in
        # between (the method below says what it does); a subclass's override stays
        if type(self).allocate_slots is KVCacheManager.allocate_slots:
            self.allocate_slots = self._core.allocate_slots  # type: ignore[method-assign]

    # ---- lookups -------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Longest prefix every group can reuse: (blocks per group, num tokens).

        Never more than `num_tokens - 1`; a multiple of every group's block
        size; 0 when caching is off. Changes nothing but the stats.
        """
        if not isinstance(request, Request):
            raise ValueError(f"request must be a Request, got {type(request).__name__}")
        if not self.enable_caching:
            return self._no_blocks, 0
        return self._core.lookup(request)  # C, or _lookup_py (the reference)

    def _lookup_py(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """`get_computed_blocks` after its checks (the reference of the C path)."""
        hashes = request.block_hashes(self.hash_algo, self.hash_block_size)
        hit = self.coordinator.find_longest_cache_hit(hashes, request.num_tokens - 1)
        num_tokens, matched = hit.length, hit.matched
        self._junctions[request] = matched
        held = self._held.get(request.request_id)
        if held is not None and held.request is request:
            held.junction = matched
        stats = self._stats
        stats.requests += 1
        stats.queries += request.num_tokens
        stats.hits += num_tokens
        stats.stranded_tokens += matched - num_tokens
        for g, n in enumerate(hit.group_lengths):
            stats.group_hits[g] += n
        if num_tokens == 0 and hashes:
            self._note_repeated_miss(hashes[0], stacklevel=4)  # (a frame more than C's)
        return KVCacheBlocks(hit.blocks), num_tokens

    def _note_repeated_miss(self, first_hash: bytes, stacklevel: int = 3) -> None:
        """Count prompt starts that keep missing (reuse is being lost); warn the
        first time unless told not to (at the caller of get_computed_blocks)."""
        misses = self._missed_prefixes
        count = misses.get(first_hash, 0) + 1
        if len(misses) >= 4096 and first_hash not in misses:
            misses.clear()
        misses[first_hash] = count
        if count != REPEATED_MISS_WARNING:
            return
        self._stats.repeated_miss_prefixes += 1
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"prefix caching: a prompt prefix was looked up {count} times and found "
                f"nothing reusable each time; the pool ({self.pool.num_blocks} blocks) may be "
                f"too small for the working set, or blocks are evicted before reuse (see "
                f"prefix_cache_stats: evictions, stranded_tokens; this warning is issued once "
                f"per manager, warn_repeated_misses=False turns it off)", RuntimeWarning,
                stacklevel=stacklevel)

    def note_reuse_elsewhere(self, request: Request) -> None:
        """The prompt start of `request`, which its last lookup found nowhere in
        the pool, is reused from a second tier after all (a KV store): that
        lookup does not count toward the repeated-miss warning."""
        hashes = request.block_hashes(self.hash_algo, self.hash_block_size)
        count = self._missed_prefixes.get(hashes[0], 0) if hashes else 0
        if count > 1:
            self._missed_prefixes[hashes[0]] = count - 1
        elif count:
            del self._missed_prefixes[hashes[0]]

    # ---- allocation ----------------------------------------------------------

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None
                       ) -> KVCacheBlocks | None:
        """Reserve slots for the next `num_new_tokens` tokens after the computed ones.

        `num_new_computed_tokens`/`new_computed_blocks` adopt a hit from
        `get_computed_blocks` (for a request that holds no blocks). Returns the
        newly allocated blocks per group (not the cached full-attention blocks
        the request takes for data it is about to recompute, which
        `get_blocks` lists with the rest), or None, with no state change at all,
        when the pool can't supply them now: other requests hold blocks, wait
        for them (or preempt one).

        Raises ValueError, changing nothing, for counts past the request's
        tokens, a hit that does not match, or an allocation the pool could not
        supply even with no other request holding blocks: waiting would never
        help (`can_fit` tells beforehand whether a request fits at all).

        A built manager has its backend's `allocate_slots` bound in this
        name (`__init__`; unless a subclass overrides it), which does what
        this body does: a request it holds whose allocation changes nothing
        returns at once; another allocation of a held request goes to
        `self._core.allocate`; any other call to `_allocate_checked`.
        """
        return self._core.allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                         new_computed_blocks)

    def _allocate_checked(self, request: Request, num_new_tokens: int,
                          num_new_computed_tokens: int,
                          new_computed_blocks: KVCacheBlocks | None) -> KVCacheBlocks | None:
        """`allocate_slots` with every argument checked (see its docstring)."""
        num_tokens = self._check_allocation(request, num_new_tokens, num_new_computed_tokens,
                                            new_computed_blocks)
        hit = new_computed_blocks.blocks if num_new_computed_tokens else None  # type: ignore
        computed = request.num_computed_tokens + num_new_computed_tokens
        held = self._held.get(request.request_id)  # checked: None or this request's
        if held is None:
            held = self._held_type(request, self._junctions.get(request, 0))
        return self._core.allocate(held, computed, num_tokens, hit)

    def _allocate_py(self, held: _Held, computed: int, num_tokens: int,
                     hit: GroupBlocks | None, releases: bool = True) -> KVCacheBlocks | None:
        """Check, then commit, an allocation the caller has validated (the C
        backend's `allocate` runs this in C; this is the reference).

        `releases=False` when the request's own limits show no group
        releases a block at `computed`."""
        coordinator, request, junction = self.coordinator, held.request, held.junction
        hashes = partial(request.block_hashes, self.hash_algo, self.hash_block_size) \
            if self.enable_caching else None
        need = coordinator.num_blocks_to_allocate(request, computed, num_tokens, hit, junction,
                                                  hashes)
        if need > 0 and need > len(self.pool.free_queue) and not self._make_room(held, need):
            return None
        new_blocks = coordinator.allocate(request, computed, num_tokens, hit, junction,
                                          releases, hashes)
        held.max_tokens, held.max_computed = coordinator.cache_blocks(request, hashes,
                                                                      num_tokens)
        self._held[request.request_id] = held
        if not any(new_blocks):
            return self._no_blocks  # no new block: the shared empty result
        return KVCacheBlocks(new_blocks)

    def _make_room(self, held: _Held, need: int) -> bool:
        """Whether `need` blocks can be had for this request without waiting.

        States kept only for reuse never stop a running request (a
        preemption): they are given up first; a new request waits for them
        like for held blocks. Raises ValueError (changing nothing) when no
        other request holds blocks: waiting would never help.
        """
        rid = held.request.request_id
        running = rid in self._held
        free = len(self.pool.free_queue)
        if running and need <= free + self.coordinator.num_releasable_retained():
            self.coordinator.release_retained()
            return True  # released blocks only add free ones
        if len(self._held) == (1 if running else 0):  # no other request holds blocks
            usable = self.pool.num_blocks - 1 - self.pool.num_pinned
            raise ValueError(
                f"request {rid!r} needs {need} more blocks but only {free} of the pool's "
                f"{usable} usable blocks are free with no other request holding any: it can "
                f"never be served at this size (see can_fit; a smaller chunk may fit)")
        return False

    def _check_allocation(self, request: Request, num_new_tokens: int,
                          num_new_computed_tokens: int,
                          new_computed_blocks: KVCacheBlocks | None) -> int:
        """Validate an allocate_slots call; return the token count after it."""
        if not isinstance(request, Request):
            raise ValueError(f"request must be a Request, got {type(request).__name__}")
        check_int("num_new_tokens", num_new_tokens, 0)
        check_int("num_new_computed_tokens", num_new_computed_tokens, 0)
        held = self._held.get(request.request_id)
        if held is not None and held.request is not request:
            raise ValueError(f"request id {request.request_id!r} is already in use by "
                             f"another request holding blocks")
        num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        if num_tokens > len(request.all_token_ids):
            raise ValueError(
                f"request {request.request_id!r}: {request.num_computed_tokens} computed + "
                f"{num_new_computed_tokens} cached + {num_new_tokens} new tokens exceed its "
                f"{request.num_tokens} tokens")
        if num_new_computed_tokens:
            self._check_hit(request, num_new_computed_tokens, new_computed_blocks)
        return num_tokens

    def _check_hit(self, request: Request, num_new_computed_tokens: int,
                   new_computed_blocks: KVCacheBlocks | None) -> None:
        if not isinstance(new_computed_blocks, KVCacheBlocks):
            raise ValueError("new_computed_blocks must be the KVCacheBlocks that "
                             "get_computed_blocks returned with num_new_computed_tokens")
        if request.request_id in self._held or request.num_computed_tokens:
            raise ValueError(f"request {request.request_id!r} already holds blocks; a cache "
                             f"hit can only be adopted by a request starting from 0")
        for manager, blocks in zip(self.coordinator.managers, new_computed_blocks.blocks):
            if len(blocks) * manager.block_size != num_new_computed_tokens:
                raise ValueError(
                    f"new_computed_blocks cover {len(blocks) * manager.block_size} tokens in "
                    f"group {manager.group_id}, not num_new_computed_tokens="
                    f"{num_new_computed_tokens}")

    def free(self, request: Request) -> None:
        """Return the request's blocks; cached ones stay reusable until evicted.

        Raises KeyError for a request that holds no blocks (never allocated, or
        freed already) and ValueError for another Request object with the id of
        one that does; neither changes anything.
        """
        if not isinstance(request, Request):
            raise ValueError(f"request must be a Request, got {type(request).__name__}")
        held = self._held.get(request.request_id) or self._held_entry("free", request.request_id)
        if held.request is not request:
            raise ValueError(f"free: request id {request.request_id!r} is held by another "
                             f"Request object; free that one")
        self._core.release(held)  # C, or _release_py (the reference)

    def _release_py(self, held: _Held) -> None:
        """`free` after its checks (the reference of the C path)."""
        self.coordinator.free(held.request, held.junction)
        del self._held[held.request.request_id]

    def _held_entry(self, caller: str, request_id: str) -> _Held:
        held = self._held.get(request_id)
        if held is None:
            raise KeyError(f"{caller}: request {request_id!r} holds no blocks (never "
                           f"allocated, or freed already)")
        return held

    # ---- views and admin -----------------------------------------------------

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks, one list per group in token order (the live
        lists: read them, do not change them). KeyError if it holds none."""
        if request_id not in self._held:
            self._held_entry("get_blocks", request_id)
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """One list per group in token order; `null_block_id` where not needed.

        KeyError for a request that holds no blocks."""
        self._held_entry("get_block_ids", request_id)
        return tuple([b.block_id for b in blocks]
                     for blocks in self.coordinator.get_blocks(request_id))

    def get_retained_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """Per group, blocks held for the request that `get_block_ids` no longer
        lists: cached Mamba states a likely hit stops at, kept until the request
        ends so that they leave the cache with the prefix they complete.

        KeyError for a request that holds no blocks."""
        self._held_entry("get_retained_block_ids", request_id)
        return tuple([b.block_id for b in m.retained(request_id)]
                     for m in self.coordinator.managers)

    def mamba_state_plan(self, group_id: int, block_ids: Sequence[int], num_computed_tokens: int,
                         num_new_tokens: int) -> MambaStatePlan:
        """Where a Mamba group's layers read and write state for one request in
        one step, from its block ids in that group (see `MambaStatePlan`).
        ValueError if group `group_id` is not a Mamba group."""
        managers = self.coordinator.managers
        if not 0 <= group_id < len(managers) or not isinstance(managers[group_id], MambaManager):
            raise ValueError(f"group {group_id!r} is not a Mamba group")
        return mamba_state_plan(block_ids, num_computed_tokens, num_new_tokens,
                                managers[group_id].block_size, self.null_block_id)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop these blocks from the prefix cache; running requests keep them.

        Raises ValueError (changing nothing) for ids outside the pool.
        """
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache; False (nothing done) while a request holds blocks."""
        return self.pool.reset_prefix_cache()

    def can_fit(self, num_tokens: int, max_chunk_tokens: int | None = None) -> bool:
        """Whether a request of `num_tokens` tokens fits in the pool when nothing
        else holds blocks, computed in chunks of `max_chunk_tokens` (all at once
        by default). False means it can never run, not that it must wait."""
        chunk = num_tokens if max_chunk_tokens is None else max_chunk_tokens
        usable = self.pool.num_blocks - 1 - self.pool.num_pinned
        return self.coordinator.max_blocks_held(num_tokens, max(chunk, 1)) <= usable

    # ---- a second tier (see hybridkv.kv_cache.external) ------------------------

    def find_cache_hit(self, request: Request, lookups: Sequence[Lookup] | None = None
                       ) -> tuple[KVCacheBlocks, int, int]:
        """`get_computed_blocks` as a pure query (no stats, no junction): (blocks,
        num tokens, the full-attention match). With `lookups` (one per group) a
        group's rule is met by pool blocks or by blocks a lookup finds elsewhere
        (placeholders, to import before use)."""
        if not self.enable_caching:
            return self._no_blocks, 0, 0
        hashes = request.block_hashes(self.hash_algo, self.hash_block_size)
        hit = self.coordinator.find_longest_cache_hit(hashes, request.num_tokens - 1, lookups)
        return KVCacheBlocks(hit.blocks), hit.length, hit.matched

    def note_junction(self, request: Request, matched: int) -> None:
        """The prompt matched cached full-attention blocks this far after blocks
        were imported (a retention hint, as `get_computed_blocks` records it)."""
        if matched > self._junctions.get(request, 0):
            self._junctions[request] = matched

    def num_blocks_to_admit(self, request: Request, hit: KVCacheBlocks, num_hit_tokens: int,
                            num_new_tokens: int) -> int:
        """Free blocks admitting a request that holds none takes with `hit`
        (placeholders included: importing one takes a block)."""
        return self.coordinator.num_blocks_to_allocate(
            request, num_hit_tokens, num_hit_tokens + num_new_tokens,
            hit.blocks if num_hit_tokens else None, self._junctions.get(request, 0))

    def begin_import(self, hit: KVCacheBlocks,
                     wanted: Sequence[tuple[int, bytes]]) -> BlockImport | None:
        """Hold the pool blocks of `hit` and take a block per (group id, hash)
        to import; None (nothing changed) when the pool is short."""
        return begin_import(self.pool, hit.blocks, wanted)

    def end_import(self, imp: BlockImport, loaded: Sequence[bool]) -> int:
        """Cache the imported blocks that arrived; release the import's references."""
        return end_import(self.pool, imp, loaded)

    def on_evict(self, callback: Callable[[list[Block]], None], *,
                 skips_empty: bool = False) -> None:
        """`callback(blocks)` with cached blocks about to be taken for new data
        (their pages still hold it): a second tier copies them out. See
        `BlockPool.on_evict` for `skips_empty`."""
        self.pool.on_evict(callback, skips_empty=skips_empty)

    def on_stale_blocks(self, callback) -> None:
        """Debug hook: `callback(block_ids)` when blocks stop holding valid data
        (taken for new data, or freed with nothing cached)."""
        self.pool.on_stale_blocks(callback)

    def subscribe(self, callback: EventSubscriber) -> None:
        """Receive BlockStored / BlockRemoved / AllBlocksCleared events."""
        self.pool.subscribe(callback)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def null_block_id(self) -> int:
        return self.pool.null_block.block_id

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        stats = self._stats
        stats.evictions = self.pool.num_evictions
        stats.group_evictions = list(self.pool.group_evictions)
        return stats

    @property
    def num_evictions(self) -> int:
        return self.pool.num_evictions

    def check_integrity(self) -> None:
        """Assert every invariant of the pool and the groups."""
        self.coordinator.check_integrity()
        for manager in self.coordinator.managers:
            for rid in manager.req_to_blocks:
                assert rid in self._held, f"{rid} holds blocks but is not tracked"
