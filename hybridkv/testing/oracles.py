"""Reference answers: what a cache hit may reuse, and what must hold around it.

An oracle is `is_reusable(length, cached_positions, spec) -> bool`: is a hit
of `length` tokens reusable by one group when exactly the block positions in
`cached_positions` (block p holds tokens [p*B, (p+1)*B)) are cached? The
built-in oracles restate the documented reuse rules from the spec's raw
fields and share no code with the managers. On top of an oracle, by brute
force: the longest reusable length, the hybrid answer and the exact blocks a
hit must return. Also the blocks a decoding request may hold, the hash map
the block events describe, and a snapshot of everything a refused
allocation must leave as it was.

>>> spec = SlidingWindowSpec(4, sliding_window=8)
>>> sliding_window_is_reusable(16, {2, 3}, spec)
True
>>> longest_reusable(sliding_window_is_reusable, spec, {1, 2}, 16)
12
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

from hybridkv.kv_cache.block_pool import Block, BlockPool
from hybridkv.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

Oracle = Callable[[int, AbstractSet[int], KVCacheSpec], bool]
DecodeBound = Callable[[KVCacheSpec, int], "int | None"]
SpecSource = KVCacheSpec | type[KVCacheSpec] | Callable[[random.Random], KVCacheSpec]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _all_cached(cached: AbstractSet[int], start: int, end: int) -> bool:
    return all(p in cached for p in range(start, end))


# ---- the five built-in rules ---------------------------------------------------


def full_is_reusable(length: int, cached: AbstractSet[int], spec: KVCacheSpec) -> bool:
    """Full attention: blocks 0 .. L/B-1 all cached."""
    bs = spec.block_size
    return length % bs == 0 and _all_cached(cached, 0, length // bs)


def sink_full_is_reusable(length: int, cached: AbstractSet[int], spec: KVCacheSpec) -> bool:
    """Sink full attention: as full (the shared sink blocks are never in a hit)."""
    return full_is_reusable(length, cached, spec)


def sliding_window_is_reusable(length: int, cached: AbstractSet[int],
                               spec: KVCacheSpec) -> bool:
    """Sliding window W: the last min(L/B, ceil((W-1)/B)) blocks before L cached,
    and with S sink tokens the first min(L/B, ceil(S/B)) blocks too."""
    assert isinstance(spec, SlidingWindowSpec)
    bs = spec.block_size
    if length % bs:
        return False
    n = length // bs
    num_window = min(n, _ceil_div(spec.sliding_window - 1, bs))
    num_sinks = min(n, _ceil_div(spec.num_sink_tokens, bs))
    return _all_cached(cached, n - num_window, n) and _all_cached(cached, 0, num_sinks)


def chunked_local_is_reusable(length: int, cached: AbstractSet[int],
                              spec: KVCacheSpec) -> bool:
    """Chunked local C: blocks floor(L/C)*C/B .. L/B-1 cached."""
    assert isinstance(spec, ChunkedLocalAttentionSpec)
    bs, chunk = spec.block_size, spec.attention_chunk_size
    if length % bs:
        return False
    return _all_cached(cached, length // chunk * chunk // bs, length // bs)


def mamba_is_reusable(length: int, cached: AbstractSet[int], spec: KVCacheSpec) -> bool:
    """Mamba: L = 0, or the state at boundary L (block L/B-1) is cached."""
    bs = spec.block_size
    return length == 0 or (length % bs == 0 and length // bs - 1 in cached)


BUILTIN_ORACLES: dict[type[KVCacheSpec], Oracle] = {
    FullAttentionSpec: full_is_reusable,
    SinkFullAttentionSpec: sink_full_is_reusable,
    SlidingWindowSpec: sliding_window_is_reusable,
    ChunkedLocalAttentionSpec: chunked_local_is_reusable,
    MambaSpec: mamba_is_reusable,
}


def oracle_for(spec: KVCacheSpec,
               oracles: Mapping[type[KVCacheSpec], Oracle] | None = None) -> Oracle:
    """The oracle for `spec` from `oracles`, then the built-ins (most specific class wins)."""
    for cls in type(spec).__mro__:
        if oracles and cls in oracles:
            return oracles[cls]
        if cls in BUILTIN_ORACLES:
            return BUILTIN_ORACLES[cls]
    raise ValueError(f"no oracle for {type(spec).__name__}; pass one in `oracles`")


# ---- brute force on top of an oracle -------------------------------------------


def longest_reusable(is_reusable: Oracle, spec: KVCacheSpec, cached: AbstractSet[int],
                     max_length: int) -> int:
    """Largest multiple of the block size <= `max_length` the oracle accepts (0 if none)."""
    bs = spec.block_size
    for length in range(max_length // bs * bs, 0, -bs):
        if is_reusable(length, cached, spec):
            return length
    return 0


def hybrid_longest_reusable(groups: Sequence[tuple[Oracle, KVCacheSpec, AbstractSet[int]]],
                            max_length: int) -> int:
    """Largest L <= `max_length`, multiple of every group's block size, that every
    group's oracle accepts; `groups` holds (oracle, spec, cached positions)."""
    align = math.lcm(*(spec.block_size for _, spec, _ in groups))
    for length in range(max_length // align * align, 0, -align):
        if all(oracle(length, cached, spec) for oracle, spec, cached in groups):
            return length
    return 0


def required_positions(is_reusable: Oracle, spec: KVCacheSpec, length: int) -> set[int]:
    """Block positions a hit of `length` tokens needs: those whose absence alone
    makes the oracle refuse. Raises ValueError if it refuses with every block cached."""
    n = length // spec.block_size
    every = set(range(n))
    if not is_reusable(length, every, spec):
        raise ValueError(f"the oracle refuses length {length} with every block cached ({spec})")
    return {p for p in range(n) if not is_reusable(length, every - {p}, spec)}


def cached_positions(pool: BlockPool, group_id: int, block_hashes: Sequence[bytes],
                     stride: int) -> dict[int, Block]:
    """Position -> cached block of one group, read from the pool's hash map.

    `block_hashes` are at the hash block size; a group whose block is
    `stride` hash blocks long keys block p by hash `(p + 1) * stride - 1`.
    """
    table = pool.cached[group_id]
    out = {}
    for p in range(len(block_hashes) // stride):
        block = table.get(block_hashes[(p + 1) * stride - 1])
        if block is not None:
            out[p] = block
    return out


def expected_hit(is_reusable: Oracle, spec: KVCacheSpec, cached: Mapping[int, Block],
                 length: int, null_block: Block) -> list[Block]:
    """The blocks a hit of `length` must return: the cached block at every
    required position, the null block elsewhere, e.g. `[null, null, b7, b8]`."""
    need = required_positions(is_reusable, spec, length)
    return [cached[p] if p in need else null_block for p in range(length // spec.block_size)]


class HybridExpectation(NamedTuple):
    """What `get_computed_blocks` must return for a request, from brute force."""

    length: int
    block_ids: tuple[list[int], ...]  # per group: required cached blocks, null elsewhere
    cached: list[dict[int, Block]]  # per group: position -> cached block


def hybrid_expectation(kv: KVCacheManager, request: Request,
                       oracles: Sequence[Oracle] | None = None) -> HybridExpectation:
    """The hybrid answer for `request` on `kv`'s current cache: the largest
    L <= num_tokens - 1, multiple of every group's block size, reusable by
    every group (one oracle per group; the built-ins by default)."""
    specs = kv.config.specs
    group_oracles = list(oracles) if oracles is not None else [oracle_for(s) for s in specs]
    hbs = kv.hash_block_size
    hashes = request.block_hashes(kv.hash_algo, hbs)
    cached = [cached_positions(kv.pool, g, hashes, s.block_size // hbs)
              for g, s in enumerate(specs)]
    rules = [(o, s, set(c)) for o, s, c in zip(group_oracles, specs, cached)]
    length = hybrid_longest_reusable(rules, request.num_tokens - 1)
    null = kv.pool.null_block
    ids = tuple([b.block_id for b in expected_hit(o, s, c, length, null)]
                for o, s, c in zip(group_oracles, specs, cached))
    return HybridExpectation(length, ids, cached)


# ---- bounds and spec generators for the built-in types -------------------------


def decode_block_bound(spec: KVCacheSpec, num_tokens: int) -> int | None:
    """Most non-null blocks one request may hold in a group right after
    `allocate_slots` covered `num_tokens` tokens in a one-token decode step
    (None: no known bound for this spec type).

    Sliding window: sink blocks + ceil((W-1)/B) + 1; chunked: C/B; Mamba: the
    live block and one pending checkpoint; full and sink full: every block.
    """
    bs = spec.block_size
    every = _ceil_div(num_tokens, bs)
    if isinstance(spec, SlidingWindowSpec):
        window = _ceil_div(spec.sliding_window - 1, bs) + 1
        return min(every, _ceil_div(spec.num_sink_tokens, bs) + window)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return min(every, spec.attention_chunk_size // bs)
    if isinstance(spec, MambaSpec):
        return 2
    if isinstance(spec, FullAttentionSpec | SinkFullAttentionSpec):
        return every
    return None


def reach_tokens(spec: KVCacheSpec) -> int:
    """How far a request must decode to be far past what the spec keeps visible:
    window + sinks, the chunk, or two blocks for the other types."""
    if isinstance(spec, SlidingWindowSpec):
        return spec.sliding_window + spec.num_sink_tokens
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return spec.attention_chunk_size
    return 2 * spec.block_size


def random_spec(spec_class: type[KVCacheSpec], rng: random.Random,
                block_size: int | None = None) -> KVCacheSpec:
    """A random small spec of a built-in class (windows shorter, equal to and
    longer than a block, not multiples of it; sinks; chunks of 1-4 blocks)."""
    bs = block_size if block_size is not None else rng.choice((1, 2, 3, 4, 8))
    if spec_class is SlidingWindowSpec:
        sinks = rng.choice((0, 0, rng.randint(1, 2 * bs)))
        return SlidingWindowSpec(bs, sliding_window=rng.randint(1, 3 * bs + 5),
                                 num_sink_tokens=sinks)
    if spec_class is ChunkedLocalAttentionSpec:
        return ChunkedLocalAttentionSpec(bs, attention_chunk_size=bs * rng.randint(1, 4))
    if spec_class is SinkFullAttentionSpec:
        return SinkFullAttentionSpec(bs, sink_len=bs * rng.randint(1, 2))
    if spec_class is MambaSpec:
        return MambaSpec(bs, checkpoint_interval=rng.choice((1, 1, 2, 3)))
    if spec_class is FullAttentionSpec:
        return FullAttentionSpec(bs)
    raise ValueError(f"no random generator for {spec_class!r}; pass a factory "
                     f"`factory(rng) -> spec` instead")


def spec_factory(source: SpecSource) -> Callable[[random.Random], KVCacheSpec]:
    """`factory(rng) -> spec` from a spec (always it), a built-in spec class
    (`random_spec` of it) or a factory (itself)."""
    if isinstance(source, type) and issubclass(source, KVCacheSpec):
        return lambda rng: random_spec(source, rng)
    return source if callable(source) else lambda rng: source  # type: ignore[return-value]


def replay_block_events(tables: Sequence[Mapping[bytes, int]],
                        events: Iterable[object]) -> list[dict[bytes, int]]:
    """The (block hash -> block id) map per group that `events` leave, starting
    from `tables`. Raises ValueError for a removal of an entry never stored."""
    out = [dict(t) for t in tables]
    for event in events:
        if isinstance(event, AllBlocksCleared):
            out = [{} for _ in out]
        elif isinstance(event, BlockStored):
            out[event.group_id][event.block_hash] = event.block_id
        elif isinstance(event, BlockRemoved) and \
                out[event.group_id].pop(event.block_hash, None) != event.block_id:
            raise ValueError(f"{event} removes an entry that was not stored")
    return out


# ---- who holds what; the state a refused allocation must keep ------------------


def holder_problem(kv: KVCacheManager, request_ids: Iterable[str],
                   sink_ids: AbstractSet[int] = frozenset()) -> str | None:
    """What is wrong with the pool's holders, or None.

    Holders are the block lists of the running `request_ids`, the blocks held
    for them off the lists (`get_retained_block_ids`), plus one for each
    shared sink block (listed by no request). Every ref count must equal its
    holders, the free queue must be exactly the blocks nobody holds, and a
    block shared by requests must sit at one (group, position) in all of them.
    """
    pool, null = kv.pool, kv.null_block_id
    holders: Counter[int] = Counter(sink_ids)
    where: dict[int, tuple[int, int]] = {}
    for rid in request_ids:
        for g, ids in enumerate(kv.get_block_ids(rid)):
            for p, block_id in enumerate(ids):
                if block_id == null:
                    continue
                holders[block_id] += 1
                if where.setdefault(block_id, (g, p)) != (g, p) or block_id in sink_ids:
                    return (f"{rid} lists block {block_id} at (group, position) {(g, p)}; "
                            f"it is at {where[block_id]} or a sink")
        retained = getattr(kv, "get_retained_block_ids", None)
        for g, ids in enumerate(retained(rid) if retained else ()):
            for block_id in ids:
                holders[block_id] += 1
                if block_id in sink_ids:
                    return f"{rid} retains block {block_id} in group {g}: a sink"
    wrong = [b for b in pool.blocks[1:] if b.ref_cnt != holders[b.block_id]]
    if wrong:
        return f"ref counts differ from the running requests' lists: {wrong[:4]}"
    free = {b.block_id for b in pool.free_queue}
    if free != {b.block_id for b in pool.blocks[1:] if not holders[b.block_id]} \
            or kv.num_free_blocks != len(free):
        return f"the free queue {sorted(free)} is not the blocks nobody holds"
    return None


def state_snapshot(kv: KVCacheManager) -> dict[str, Any]:
    """Everything a refused allocation must leave as it was."""
    pool, managers = kv.pool, kv.coordinator.managers
    stats = kv.prefix_cache_stats
    return {
        "free queue order": [b.block_id for b in pool.free_queue],
        "blocks (ref count, hash, group)": [(b.ref_cnt, b.block_hash, b.group_id)
                                            for b in pool.blocks],
        "hash maps": [{h: b.block_id for h, b in t.items()} for t in pool.cached],
        "evictions": pool.num_evictions,
        "request block ids": [{rid: [b.block_id for b in blocks]
                               for rid, blocks in m.req_to_blocks.items()} for m in managers],
        "cached block counts": [dict(m.num_cached_blocks) for m in managers],
        "skipped block counts": [dict(m.num_skipped) for m in managers],
        "stats": (stats.requests, stats.queries, stats.hits),
    }


def snapshot_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Names of the parts that differ between two `state_snapshot`s."""
    return [key for key in before if before[key] != after.get(key)]
