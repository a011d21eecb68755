"""The conformance suite: a manager's cache hits against brute force over random states.

Each case runs real requests through a `KVCacheManager` on a small pool
(prefix-sharing prompts, chunked prefill, short and long decodes, requests
left running, refusals when the pool runs dry), drops random cached blocks of
ONE group with `evict_blocks` so the groups disagree, then queries with a
request sharing a random-length prefix. Checks: (a) a hit is the longest
length every group's oracle accepts (brute force over the positions cached in
the pool's hash map), exactly the required cached blocks, null elsewhere, each
holding the query's prefix as recorded when written; each group's own search
at a random limit too; (b) after every step `check_integrity()`, ref counts =
the running requests' lists, completed blocks reusable, events replaying to
the map; (c) a refused `allocate_slots` changes nothing; (d) a decoding
request holds at most `decode_block_bound` blocks.

>>> from hybridkv import SlidingWindowSpec
>>> from hybridkv.kv_cache.managers import SlidingWindowManager
>>> from hybridkv.testing import run_conformance, sliding_window_is_reusable
>>> run_conformance(SlidingWindowSpec, SlidingWindowManager, sliding_window_is_reusable,
...                 num_cases=20).assert_ok()
"""

from __future__ import annotations

import math
import random
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from unittest.mock import patch

from hybridkv.kv_cache import specs as sp
from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.checks import check_int
from hybridkv.kv_cache.eviction import make_eviction_policy
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheBlocks, KVCacheManager
from hybridkv.kv_cache.managers import SPEC_TO_MANAGER, SingleTypeManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import KVCacheSpec
from hybridkv.testing import oracles as ref
from hybridkv.testing.oracles import DecodeBound, Oracle, SpecSource, snapshot_diff, state_snapshot

VOCAB, MAX_FAILURES = 997, 50


class ConformanceError(AssertionError):
    """A conformance check failed."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConformanceError(message)


@dataclass
class ConformanceReport:
    """Counts of what the suite exercised, and every failed case (one line each)."""

    name: str
    num_cases: int = 0
    num_queries: int = 0
    num_hits: int = 0  # queries that reused a non-zero prefix
    num_disagreements: int = 0  # queries where some group alone would reuse more
    num_refusals: int = 0
    num_decode_steps: int = 0
    num_failed_cases: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:  # no case failed
        return self.num_failed_cases == 0

    def assert_ok(self) -> None:
        """Raise AssertionError listing the first failures, if any case failed."""
        if not self.ok:
            raise AssertionError("\n".join([str(self), *self.failures[:5]]))

    def __str__(self) -> str:
        return (f"{self.name}: {self.num_cases} cases, {self.num_queries} queries ({self.num_hits}"
                f" hits, {self.num_disagreements} where groups disagree), {self.num_refusals} "
                f"refusals, {self.num_decode_steps} decode steps, {self.num_failed_cases} failed")


# ---- one randomized case -----------------------------------------------------


class _Case:
    """One manager, a few rounds of requests, evictions and checked queries."""

    def __init__(self, specs: Sequence[KVCacheSpec], oracles: Sequence[Oracle],
                 bound: DecodeBound, rng: random.Random, report: ConformanceReport,
                 eviction_policy: str) -> None:
        self.specs, self.oracles, self.bound = list(specs), list(oracles), bound
        self.rng, self.report = rng, report
        sizes = [s.block_size for s in specs]
        reach = max(map(ref.reach_tokens, specs))
        self.max_prompt = max(3 * math.lcm(*sizes), 2 * reach) + max(sizes)
        self.max_block = max(sizes)
        self.long_decode = reach + 2 * self.max_block
        sinks = sum(getattr(s, "num_sink_blocks", 0) for s in specs)
        # about what one prefill of the longest prompt holds: pressure, refusals
        base = 2 + sinks + sum(-(-self.max_prompt // b) for b in sizes)
        low, high = rng.choice(((1, 2), (2, 4), (2, 4), (3, 6)))  # tight, normal or roomy
        num_blocks = rng.randint(max(sinks + 2, base * low // 3), base * high // 3)
        groups = [KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)]
        self.kv = KVCacheManager(KVCacheConfig(num_blocks, groups),
                                 eviction_policy=eviction_policy, warn_repeated_misses=False)
        self.sink_ids = {b.block_id for m in self.kv.coordinator.managers
                         for b in m.pinned_blocks()}
        self.events: list[object] = []
        self.kv.subscribe(self.events.append)
        self.mirror: list[dict[bytes, int]] = [{} for _ in specs]  # the map the events tell
        self.live: dict[str, Request] = {}  # requests holding blocks
        self.histories: list[list[int]] = []  # tokens of ended requests, to share prefixes of
        self.content: dict[int, tuple[int, bytes]] = {}  # block id -> (group, prefix hash)
        self.expected_stats = [0, 0]  # tokens queried, tokens hit
        self.num_requests = self.num_replayed = 0

    def run(self) -> None:
        for _ in range(self.rng.randint(3, 6)):
            for _ in range(self.rng.randint(1, 3)):
                self.serve()
            self.evict_one_group()
            if self.rng.random() < 0.15:
                self.try_reset()
        for req in list(self.live.values()):
            self.release(req)  # then every block but the sinks must be free

    # ---- requests ------------------------------------------------------------

    def new_prompt(self) -> list[int]:
        rng, prefix = self.rng, []
        sources = self.histories[-3:] + [r.all_token_ids for r in self.live.values()]
        if sources and rng.random() < 0.8:
            history = rng.choice(sources)
            prefix = history[:rng.choice((len(history), rng.randint(0, len(history))))]
        tail = [rng.randrange(VOCAB) for _ in range(rng.randint(0, self.max_prompt // 2))]
        return (prefix + tail)[:self.max_prompt] or [rng.randrange(VOCAB)]

    def chunk(self, remaining: int) -> int:  # a whole or a random part of the rest
        return remaining if self.rng.random() < 0.5 else self.rng.randint(1, remaining)

    def serve(self) -> None:
        """Query, adopt the hit, prefill in chunks, decode; keep running or free."""
        rng = self.rng
        req = Request(f"r{self.num_requests}", self.new_prompt())
        self.num_requests += 1
        blocks, hit = self.query(req)
        if not self.allocate(req, self.chunk(req.num_tokens - hit), hit, blocks):
            return
        while req.num_computed_tokens < req.num_tokens:
            if not self.allocate(req, self.chunk(req.num_tokens - req.num_computed_tokens)):
                return
        if rng.random() < 0.2:  # a step no pool can take, where blocks may be released
            probe = (self.kv.pool.num_blocks + 1) * self.max_block * 3
            req.append_output_token_ids([rng.randrange(VOCAB) for _ in range(probe)])
            if not self.allocate(req, probe):
                return
        long = rng.random() < 0.3  # far past every window and chunk
        for _ in range(rng.randint(*((self.long_decode, 2 * self.long_decode) if long
                                     else (0, 3)))):
            burst = 1 if rng.random() < 0.9 else rng.randint(2, 2 * self.max_block + 1)
            req.append_output_token_ids([rng.randrange(VOCAB) for _ in range(burst)])
            if not self.allocate(req, burst, decode=burst == 1):
                return
        if rng.random() < 0.35 and len(self.live) <= 2:
            return  # keeps running: its blocks stay held while others come and go
        self.release(req)

    def release(self, req: Request) -> None:
        """Free a request holding blocks; then the manager must not know it."""
        self.kv.free(req)
        self.live.pop(req.request_id)
        if req.num_computed_tokens:
            self.histories = (self.histories + [list(req.all_token_ids)])[-8:]
        try:
            self.kv.get_block_ids(req.request_id)
        except KeyError:
            pass
        else:
            raise ConformanceError(f"{req.request_id} still has block lists after free")
        self.check_state()

    def allocate(self, req: Request, num_new: int, num_hit: int = 0,
                 hit: KVCacheBlocks | None = None, decode: bool = False) -> bool:
        """allocate_slots, then the model step; a refusal must change nothing."""
        kv = self.kv
        before, num_events = state_snapshot(kv), len(self.events)
        # blocks held for running requests off their lists (see get_retained_block_ids):
        # a running request's allocation the pool can't otherwise supply releases them
        retained = {b for rid in self.live for g in kv.get_retained_block_ids(rid) for b in g}
        start = req.num_computed_tokens + num_hit
        try:
            new_blocks = kv.allocate_slots(req, num_new, num_hit, hit)
        except ValueError:  # can never fit: only when no other request holds blocks
            _check(not set(self.live) - {req.request_id},
                   f"allocate_slots({req}, {num_new}) raised while others hold blocks")
            new_blocks = None
        if new_blocks is None:
            self.report.num_refusals += 1
            diff = snapshot_diff(before, state_snapshot(kv))
            _check(not diff and len(self.events) == num_events,
                   f"a refused allocate_slots({req}, {num_new}, {num_hit}) changed "
                   f"{diff or 'the events'}")
            if req.request_id in self.live:
                self.release(req)
            return False
        self.live[req.request_id] = req
        now = kv.get_block_ids(req.request_id)  # new blocks: free or released by this step
        mine = {b for g in before["request block ids"] for b in g.get(req.request_id, ())}
        free = mine.union(before["free queue order"], retained)
        for g, ids in enumerate(new_blocks.get_block_ids()):
            _check(free.issuperset(ids) and set(ids) <= set(now[g]),
                   f"group {g}: new blocks {ids} were not free or are not the request's {now}")
        adopted = hit.get_block_ids() if hit is not None and num_hit else ()
        _check(all(now[g][:len(ids)] == ids for g, ids in enumerate(adopted)),
               f"{req.request_id} holds {now}, not the hit {adopted} it adopted")
        req.num_computed_tokens = start + num_new
        self.after_step(req, start, decode)
        return True

    def after_step(self, req: Request, start: int, decode: bool) -> None:
        """Record what the step wrote; check slots and the decode bound."""
        kv, end = self.kv, req.num_computed_tokens
        hashes = req.block_hashes(kv.hash_algo, kv.hash_block_size)
        null = kv.null_block_id
        for g, (spec, ids) in enumerate(zip(self.specs, kv.get_block_ids(req.request_id))):
            bs, stride = spec.block_size, spec.block_size // kv.hash_block_size
            _check(len(ids) * bs >= end, f"group {g}: {ids} cover fewer than {end} tokens")
            if isinstance(spec, sp.AttentionSpec):
                need = ref.required_positions(self.oracles[g], spec, start) if start % bs == 0 \
                    else ()  # what the step's first token reads, by the reuse rule
                _check(null not in ids[start // bs:-(-end // bs)]
                       and all(ids[p] != null for p in need),
                       f"group {g}: tokens {start}..{end} lack a slot or a block they read "
                       f"(positions {sorted(need)}) in {ids}")
            elif isinstance(spec, sp.MambaSpec):
                _check(ids[-1] != null and kv.pool.blocks[ids[-1]].block_hash is None,
                       f"group {g}: live state block missing or cached in {ids}")
            for p in range(start // bs, end // bs):  # blocks completed by this step
                if ids[p] != null:  # what it holds; reusable now
                    self.content[ids[p]] = key = (g, hashes[(p + 1) * stride - 1])
                    _check(key[1] in kv.pool.cached[g], f"group {g}: full {ids[p]} not cached")
            limit, held = self.bound(spec, end) if decode else None, len(ids) - ids.count(null)
            _check(limit is None or held <= limit,
                   f"group {g} ({spec}): decoding at {end} tokens holds {held} blocks "
                   f"> {limit}: {ids}")
        self.report.num_decode_steps += decode
        self.check_state()

    # ---- queries -------------------------------------------------------------

    def query(self, req: Request) -> tuple[KVCacheBlocks, int]:
        """get_computed_blocks against the hybrid oracle; each group at a random limit."""
        kv = self.kv
        before, num_events = state_snapshot(kv), len(self.events)
        blocks, length = kv.get_computed_blocks(req)
        self.expected_stats = [self.expected_stats[0] + req.num_tokens,
                               self.expected_stats[1] + length]
        diff = [k for k in snapshot_diff(before, state_snapshot(kv)) if k != "stats"]
        _check(not diff and len(self.events) == num_events, f"a query changed {diff}")
        want = ref.hybrid_expectation(kv, req, self.oracles)
        cached = want.cached  # per group: position -> cached block
        _check(length == want.length and blocks.get_block_ids() == want.block_ids,
               f"hit of {length} tokens {blocks.get_block_ids()} for {req.num_tokens} tokens; "
               f"the oracle says {want.length} {want.block_ids} (cached positions "
               f"{[sorted(c) for c in cached]})")
        hashes = req.block_hashes(kv.hash_algo, kv.hash_block_size)
        for g, ids in enumerate(want.block_ids):
            self.check_content(g, ids, hashes)
            self.check_group_search(g, hashes, cached[g], req.num_tokens)
        self.report.num_queries += 1
        self.report.num_hits += length > 0
        self.report.num_disagreements += any(  # some group alone would reuse more
            ref.longest_reusable(o, s, set(c), req.num_tokens - 1) > length
            for o, s, c in zip(self.oracles, self.specs, cached))
        return blocks, length

    def check_content(self, g: int, ids: Sequence[int], hashes: Sequence[bytes]) -> None:
        """Every block of a hit holds the data of the query's prefix up to it."""
        stride = self.specs[g].block_size // self.kv.hash_block_size
        wrong = [p for p, i in enumerate(ids) if i != self.kv.null_block_id
                 and self.content.get(i) != (g, hashes[(p + 1) * stride - 1])]
        _check(not wrong, f"group {g}: hit blocks {ids} at {wrong} hold other data")

    def check_group_search(self, g: int, hashes: Sequence[bytes], cached: Mapping[int, Block],
                           num_tokens: int) -> None:
        """One manager's find_longest_cache_hit at a random limit against its oracle."""
        spec, oracle = self.specs[g], self.oracles[g]
        max_length = self.rng.randint(0, num_tokens)
        manager = self.kv.coordinator.managers[g]
        hit = [b.block_id for b in manager.find_longest_cache_hit(hashes, max_length)]
        want = ref.longest_reusable(oracle, spec, set(cached), max_length)
        expected = [b.block_id for b in ref.expected_hit(oracle, spec, cached, want,
                                                     self.kv.pool.null_block)]
        _check(hit == expected, f"group {g} ({spec}): find_longest_cache_hit(max_length="
                                f"{max_length}) returned {hit}, the oracle says {expected} "
                                f"(cached positions {sorted(cached)})")

    def evict_one_group(self) -> None:
        """Drop a random part of one group's cached blocks so the groups disagree."""
        pool, rng = self.kv.pool, self.rng
        g = rng.randrange(len(self.specs))
        share = rng.choice((0.1, 0.2, 0.3, 0.5, 1.0))
        ids = [b.block_id for b in pool.cached[g].values() if rng.random() < share]
        sizes = [len(t) - (len(ids) if i == g else 0) for i, t in enumerate(pool.cached)]
        self.kv.evict_blocks(ids)
        _check([len(t) for t in pool.cached] == sizes
               and all(pool.blocks[i].block_hash is None for i in ids),
               f"evict_blocks({ids}) of group {g} dropped other entries or kept these")
        self.check_state()

    def try_reset(self) -> None:
        before = state_snapshot(self.kv)
        done = self.kv.reset_prefix_cache()
        _check(not done and not snapshot_diff(before, state_snapshot(self.kv)) if self.live
               else done and not any(self.kv.pool.cached),
               f"reset_prefix_cache returned {done} with {len(self.live)} requests running")
        self.check_state()

    def check_state(self) -> None:
        """(b): facade integrity, ref counts = holders, cached data = hash, stats."""
        kv = self.kv
        kv.check_integrity()
        pool = kv.pool
        problem = ref.holder_problem(kv, self.live, self.sink_ids)
        _check(problem is None, f"{problem}")
        for g, table in enumerate(pool.cached):
            for block_hash, block in table.items():
                _check(self.content.get(block.block_id) == (g, block_hash),
                       f"group {g}: cached {block} holds data of another prefix")
        stats = kv.prefix_cache_stats
        _check([stats.queries, stats.hits] == self.expected_stats,
               f"stats {stats} != expected queries/hits {self.expected_stats}")
        self.mirror = ref.replay_block_events(self.mirror, self.events[self.num_replayed:])
        self.num_replayed = len(self.events)
        _check(self.mirror == [{h: b.block_id for h, b in t.items()} for t in pool.cached],
               "the block events do not replay to the pool's hash map")


# ---- entry points ------------------------------------------------------------


def _run_cases(name: str, make_specs: Callable[[random.Random], Sequence[KVCacheSpec]],
               oracles: Callable[[KVCacheSpec], Oracle], bound: DecodeBound,
               manager_class: type[SingleTypeManager] | None, num_cases: int, seed: int,
               first_case: int, eviction_policy: str) -> ConformanceReport:
    check_int("num_cases", num_cases, 1)
    make_eviction_policy(eviction_policy, [])  # ValueError for an unknown name
    report = ConformanceReport(name)
    for case in range(first_case, first_case + num_cases):
        rng = random.Random(f"{seed}:{case}")
        specs = list(make_specs(rng))
        if not specs or not all(isinstance(s, KVCacheSpec) for s in specs):
            raise ValueError(f"expected one KVCacheSpec per group, got {specs!r}")
        try:
            override = {type(specs[0]): manager_class} if manager_class else {}
            with patch.dict(SPEC_TO_MANAGER, override):  # restores the registry after
                _Case(specs, [oracles(s) for s in specs], bound, rng, report,
                      eviction_policy).run()
        except Exception as e:  # a failed case is reported, the others still run
            report.num_failed_cases += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            if len(report.failures) < MAX_FAILURES:
                report.failures.append(
                    f"case {case} (seed={seed}) {specs}: {type(e).__name__}: {e} "
                    f"[{where.filename.rsplit('/', 1)[-1]}:{where.lineno}]")
        report.num_cases += 1
    return report


def run_conformance(spec_source: SpecSource, manager_class: type[SingleTypeManager],
                    is_reusable: Oracle, *, num_cases: int = 200, seed: int = 0,
                    decode_bound: DecodeBound = ref.decode_block_bound,
                    first_case: int = 0, eviction_policy: str = "lru") -> ConformanceReport:
    """Check `manager_class` against `is_reusable` on one group, over random states.

    `spec_source` is a spec, a built-in spec class (random small specs of it)
    or `factory(rng) -> spec`. `is_reusable(length, cached_positions, spec)`
    is the rule of the type. `decode_bound(spec, num_tokens)` caps the blocks
    a decoding request holds (None: unchecked). Case k uses its own seed, so
    `first_case=k, num_cases=1` replays it. The pool evicts by `eviction_policy`
    (the checks hold for any policy). Never raises for a failed check: see
    `report.failures` or call `report.assert_ok()`.
    """
    if not (isinstance(manager_class, type) and issubclass(manager_class, SingleTypeManager)):
        raise ValueError(f"manager_class must subclass SingleTypeManager, got {manager_class!r}")
    if not callable(is_reusable):
        raise ValueError(f"is_reusable must be callable, got {is_reusable!r}")
    factory = ref.spec_factory(spec_source)
    return _run_cases(manager_class.__name__, lambda rng: [factory(rng)],
                      lambda spec: is_reusable, decode_bound, manager_class, num_cases, seed,
                      first_case, eviction_policy)


def run_hybrid_conformance(specs: Sequence[KVCacheSpec]
                           | Callable[[random.Random], Sequence[KVCacheSpec]], *,
                           oracles: Mapping[type[KVCacheSpec], Oracle] | None = None,
                           num_cases: int = 200, seed: int = 0,
                           decode_bound: DecodeBound = ref.decode_block_bound,
                           first_case: int = 0, name: str | None = None,
                           eviction_policy: str = "lru") -> ConformanceReport:
    """Check the registered managers and the coordinator on a group mix.

    `specs` is one spec per group, or `factory(rng) -> specs`. Each group's
    oracle comes from `oracles` (by spec class), else the built-ins; the
    expected hit is the largest L <= num_tokens - 1, multiple of every block
    size, that every group's oracle accepts. Other arguments as `run_conformance`.
    """
    make_specs = specs if callable(specs) else (lambda rng, fixed=list(specs): fixed)
    label = name or "+".join(type(s).__name__ for s in make_specs(random.Random(seed)))
    return _run_cases(label, make_specs, lambda spec: ref.oracle_for(spec, oracles), decode_bound,
                      None, num_cases, seed, first_case, eviction_policy)
