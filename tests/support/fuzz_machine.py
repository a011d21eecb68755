"""The hypothesis state machine of `support.fuzz` (see there)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import SinkFullAttentionSpec
from hybridkv.testing.oracles import (
    holder_problem,
    hybrid_expectation,
    snapshot_diff,
    state_snapshot,
)
from hybridkv.tools.spec_mixes import CONFIGS
from support.fuzz import (
    BASES,
    EVICTION_POLICIES,
    LORAS,
    MAX_PROMPT,
    SALTS,
    VOCAB,
    FuzzStats,
)
from support.shadow import ShadowCache, ShadowViolation


class KVCacheMachine(RuleBasedStateMachine):
    """Random manager traffic with every invariant checked after each rule.

    Subclasses made by `make_machine` pick the configs, policies and stats.
    """

    config_names: Sequence[str] = tuple(CONFIGS)
    policies: Sequence[str] = EVICTION_POLICIES
    stats = FuzzStats()
    # compare every lookup with the brute-force hybrid oracle (off: the shadow alone)
    check_oracle = True

    @initialize(data=st.data())
    def setup(self, data) -> None:
        name = data.draw(st.sampled_from(sorted(self.config_names)), label="config")
        policy = data.draw(st.sampled_from(list(self.policies)), label="eviction_policy")
        algo = data.draw(st.sampled_from(["sha256", "xxhash"]), label="hash_algo")
        caching = data.draw(st.sampled_from([True] * 7 + [False]), label="caching")
        specs = CONFIGS[name]
        sinks = sum(getattr(s, "num_sink_blocks", 0) for s in specs
                    if isinstance(s, SinkFullAttentionSpec))
        num_blocks = data.draw(st.integers(sinks + 3, sinks + 24 * len(specs) + 24),
                               label="num_blocks")
        groups = [KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)]
        self.kv = KVCacheManager(KVCacheConfig(num_blocks, groups), enable_caching=caching,
                                 hash_algo=algo, eviction_policy=policy,
                                 warn_repeated_misses=False)
        self.shadow = ShadowCache(specs, self.kv.null_block_id, algo, self.kv.hash_block_size,
                                  caching)
        self.align = math.lcm(*(s.block_size for s in specs))
        self.sink_ids = {b.block_id for m in self.kv.coordinator.managers
                         for b in m.pinned_blocks()}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.pending: dict[str, int] = {}  # allocated, not yet advanced: tokens
        self.evicted: set[int] = set()  # passed to evict_blocks since last written
        self.history: list[list[int]] = []  # tokens of the last finished requests
        self.num_requests = 0
        self.stats.examples += 1
        self.stats.configs[f"{name}/{policy}"] += 1

    # ---- requests ------------------------------------------------------------

    @rule(source=st.integers(0, 9), cut=st.integers(0, MAX_PROMPT + 8),
          tail=st.lists(st.integers(0, VOCAB - 1), max_size=12),
          salt=st.sampled_from(SALTS), lora=st.sampled_from(LORAS))
    def new_request(self, source, cut, tail, salt, lora) -> None:
        """A prompt sharing a prefix of a base or of another (maybe finished) request:
        `cut` tokens of it (past MAX_PROMPT: all of it, a follow-up turn), then `tail`."""
        self._step()
        others = self.history + [r.all_token_ids for r in self.waiting + self.running]
        prefix = BASES[source % len(BASES)] if source < len(BASES) or not others \
            else others[source % len(others)]
        tokens = (list(prefix[:cut] if cut <= MAX_PROMPT else prefix) + tail)[:2 * MAX_PROMPT]
        self.num_requests += 1
        self.waiting.append(Request(f"r{self.num_requests}", tokens or [source % VOCAB],
                                    cache_salt=salt, lora_name=lora))

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 99))
    def lookup(self, i) -> None:
        """get_computed_blocks: the oracle's answer, holding the request's own data."""
        self._step()
        self._lookup(self.waiting[i % len(self.waiting)])

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 99), chunk=st.integers(1, 48))
    def admit(self, i, chunk) -> None:
        """Look up a waiting request and allocate its first chunk, adopting the hit."""
        self._step()
        req = self.waiting[i % len(self.waiting)]
        blocks, hit = self._lookup(req)
        n = min(chunk, req.num_tokens - hit)
        if self._allocate(req, n, hit, blocks if hit else None):
            self.waiting.remove(req)

    @precondition(lambda self: self._ready())
    @rule(i=st.integers(0, 99), chunk=st.integers(1, 24))
    def allocate(self, i, chunk) -> None:
        """The next prefill chunk (or appended tokens) of a running request."""
        self._step()
        req = self._pick(self._ready(), i)
        self._allocate(req, min(chunk, req.num_tokens - req.num_computed_tokens))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 99), tokens=st.lists(st.integers(0, VOCAB - 1), min_size=1,
                                                 max_size=10))
    def append(self, i, tokens) -> None:
        self._step()
        self.running[i % len(self.running)].append_output_token_ids(tokens)

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 99))
    def advance(self, i) -> None:
        """The model step ran: the allocated tokens are computed."""
        self._step()
        req = self._pick([r for r in self.running if r.request_id in self.pending], i)
        req.num_computed_tokens += self.pending.pop(req.request_id)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 99), count=st.integers(1, 24), token=st.integers(0, VOCAB - 1))
    def decode(self, i, count, token) -> None:
        """Up to `count` one-token steps (append, allocate, advance), past windows and chunks."""
        self._step()
        req = self.running[i % len(self.running)]
        for k in range(count):
            if req.request_id in self.pending:
                req.num_computed_tokens += self.pending.pop(req.request_id)
            if req.num_computed_tokens == req.num_tokens:
                req.append_output_token_ids((token + k) % VOCAB)
            if not self._allocate(req, 1):
                return
            self.stats.decoded_tokens += 1

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 99), preempt=st.booleans())
    def free(self, i, preempt) -> None:
        """Finish a request, or preempt it (it restarts from 0 later)."""
        self._step()
        req = self.running.pop(i % len(self.running))
        self.kv.free(req)
        self.pending.pop(req.request_id, None)
        after = state_snapshot(self.kv)  # the request is unknown now: KeyError, no change
        self._require(_raises_key_error(self.kv.free, req)
                      and _raises_key_error(self.kv.get_block_ids, req.request_id)
                      and not snapshot_diff(after, state_snapshot(self.kv)),
                      f"free({req.request_id}) again or get_block_ids after free did not "
                      f"raise KeyError, or changed the state")
        if preempt:
            req.num_computed_tokens = 0
            self.waiting.insert(0, req)
            self.stats.preemptions += 1
        else:
            self.history = (self.history + [list(req.all_token_ids)])[-4:]

    @rule(picks=st.lists(st.integers(0, 999), max_size=3), stray=st.booleans(),
          action=st.integers(0, 7))
    def evict(self, picks, stray, action) -> None:
        """evict_blocks on chosen cached blocks (and maybe uncached or held ones);
        one time in eight, reset_prefix_cache instead."""
        self._step()
        if action == 7:
            self._reset()
            return
        pool = self.kv.pool
        cached = sorted(b.block_id for t in pool.cached for b in t.values())
        ids = [cached[p % len(cached)] for p in picks] if cached else []
        if stray:
            ids += [p % pool.num_blocks for p in picks]
        self.kv.evict_blocks(ids)
        self._require(all(pool.blocks[i].block_hash is None for i in ids),
                      f"evict_blocks({ids}) kept some of them cached")
        self.evicted.update(ids)
        self.stats.explicit_evictions += len(ids)

    def _reset(self) -> None:
        before = state_snapshot(self.kv)
        done = self.kv.reset_prefix_cache()
        self._require(done == (not self.running), f"reset_prefix_cache() returned {done} with "
                      f"{len(self.running)} requests holding blocks")
        if done:
            self._require(not any(self.kv.pool.cached), "reset left cached blocks")
            self.stats.resets += 1
        else:
            self._require(not snapshot_diff(before, state_snapshot(self.kv)),
                          "a refused reset_prefix_cache changed the state")

    # ---- invariants ----------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        kv = self.kv
        kv.check_integrity()
        problem = holder_problem(kv, [r.request_id for r in self.running], self.sink_ids)
        self._require(problem is None, f"{problem}")
        held = sum(1 for b in kv.pool.blocks[1:] if b.ref_cnt > 0)
        self._require(kv.num_free_blocks == kv.pool.num_blocks - 1 - held,
                      f"{kv.num_free_blocks} free blocks with {held} of "
                      f"{kv.pool.num_blocks - 1} held")
        for block_id, n in self._holders().items():
            block = kv.pool.blocks[block_id]
            self._require(n == 1 or block.block_hash is not None or block_id in self.evicted,
                          f"{n} requests share block {block_id}, which was never cached")
        for req in self.running:
            self.shadow.check_request(req, kv.get_block_ids(req.request_id), self._written(req))
        self.shadow.check_cached_map(kv.pool)

    def teardown(self) -> None:
        if not hasattr(self, "kv"):
            return
        for req in self.running:
            self.kv.free(req)
        self.kv.check_integrity()
        self._require(self.kv.num_free_blocks == self.kv.pool.num_blocks - 1 - len(self.sink_ids),
                      "blocks leaked after every request was freed")

    # ---- helpers -------------------------------------------------------------

    def _step(self) -> None:
        self.stats.steps += 1

    @staticmethod
    def _require(ok: bool, message: str) -> None:
        if not ok:
            raise ShadowViolation(message)

    @staticmethod
    def _pick(candidates: list[Request], i: int) -> Request:
        return candidates[i % len(candidates)]

    def _ready(self) -> list[Request]:
        """Running requests with tokens left to compute and nothing pending."""
        return [r for r in self.running if r.request_id not in self.pending
                and r.num_computed_tokens < r.num_tokens]

    def _written(self, req: Request) -> int:
        return req.num_computed_tokens + self.pending.get(req.request_id, 0)

    def _holders(self) -> Counter:
        null = self.kv.null_block_id
        return Counter(b for r in self.running for ids in self.kv.get_block_ids(r.request_id)
                       for b in ids if b != null)

    def _lookup(self, req: Request):
        kv = self.kv
        before = state_snapshot(kv)
        blocks, hit = kv.get_computed_blocks(req)
        changed = [k for k in snapshot_diff(before, state_snapshot(kv)) if k != "stats"]
        self._require(not changed, f"a lookup changed {changed}")
        ids = blocks.get_block_ids()
        self._require(hit % self.align == 0 and 0 <= hit <= req.num_tokens - 1,
                      f"hit of {hit} tokens for {req.num_tokens} (alignment {self.align})")
        if kv.enable_caching and self.check_oracle:
            want = hybrid_expectation(kv, req)
            self._require((hit, ids) == (want.length, want.block_ids),
                          f"hit {hit} {ids}; the oracle says {want.length} {want.block_ids}")
        self.shadow.check_hit(req, ids, hit)
        self.stats.lookups += 1
        self.stats.hits += hit > 0
        self.stats.hit_tokens += hit
        return blocks, hit

    def _allocate(self, req: Request, n: int, num_hit: int = 0, hit=None) -> bool:
        """allocate_slots, then record the step's writes; a refusal changes nothing."""
        kv = self.kv
        before = state_snapshot(kv)
        start = req.num_computed_tokens + num_hit
        try:
            new_blocks = kv.allocate_slots(req, n, num_hit, hit)
        except ValueError:  # can never fit: only when no other request holds blocks
            self._require(all(r is req for r in self.running),
                          f"allocate_slots({req}, {n}) raised while others hold blocks")
            new_blocks = None
        if new_blocks is None:
            diff = snapshot_diff(before, state_snapshot(kv))
            self._require(not diff, f"a refused allocate_slots({req}, {n}) changed {diff}")
            self.stats.refusals += 1
            return False
        req.num_computed_tokens = start
        self.pending[req.request_id] = n
        if req not in self.running:
            self.running.append(req)
        written = self.shadow.record_step(req, kv.get_block_ids(req.request_id), start,
                                          start + n, self._holders(), self.sink_ids)
        self.evicted.difference_update(written)  # new data: shared only through a hit again
        self.stats.allocations += 1
        return True


def _raises_key_error(call, arg) -> bool:
    try:
        call(arg)
    except KeyError:
        return True
    return False
