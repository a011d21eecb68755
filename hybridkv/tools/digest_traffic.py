"""What `hybridkv.tools.digest` replays, and how it records: a scheduler loop over
trace requests, seeded random traffic, and the recorder.

`TraceDriver` is a small continuous-batching loop of its own (running requests
first, one prefill chunk or decode token each; then admissions in arrival
order; a failed allocation preempts the newest request), so the digests do
not depend on the benchmark drivers. `RandomTraffic` draws scheduler actions
on a small pool. Both record every manager decision into a `Recorder`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import deque

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request


class Recorder:
    """Collects what a manager decided, as reprs fed to one sha256."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.count = 0

    def add(self, *item: object) -> None:
        self._hash.update(repr(item).encode())
        self._hash.update(b"\n")
        self.count += 1

    def listen(self, manager: KVCacheManager) -> None:
        """Record events, evicted blocks and stale blocks as they happen."""
        manager.subscribe(lambda event: self.add("event", repr(event)))
        manager.on_evict(lambda blocks: self.add("evict", [(b.block_id, b.block_hash)
                                                           for b in blocks]))
        manager.on_stale_blocks(lambda ids: self.add("stale", list(ids)))

    def final_state(self, manager: KVCacheManager) -> None:
        manager.check_integrity()
        stats = dataclasses.asdict(manager.prefix_cache_stats)
        pool = manager.pool
        self.add("stats", sorted(stats.items()), manager.num_free_blocks)
        self.add("free queue", [b.block_id for b in pool.free_queue])
        self.add("cached", [sorted((h, b.block_id) for h, b in table.items())
                            for table in pool.cached])
        self.add("blocks", [(b.ref_cnt, b.num_hits, int(b.value_hint)) for b in pool.blocks])

    def hexdigest(self) -> str:
        return self._hash.hexdigest()[:16]


def _ids(blocks) -> list[list[int]] | None:
    return None if blocks is None else [[b.block_id for b in g] for g in blocks.blocks]


class _Slot:
    __slots__ = ("req", "output", "after", "appended")

    def __init__(self, trace_request) -> None:
        prompt = getattr(trace_request, "prompt", None) or trace_request.prompt_token_ids
        self.output = getattr(trace_request, "output", None)
        if self.output is None:
            self.output = trace_request.decode_token_ids
        self.after = getattr(trace_request, "after", None)
        self.req = Request(trace_request.request_id, list(prompt))
        self.appended = 0

    @property
    def done(self) -> bool:
        req = self.req
        return self.appended == len(self.output) and req.num_computed_tokens == req.num_tokens


class TraceDriver:
    """Replays trace requests (`request_id`, prompt and output tokens, an optional
    `after`) through a manager, recording every call."""

    def __init__(self, kv: KVCacheManager, rec: Recorder, max_running: int,
                 budget: int = 8192) -> None:
        self.kv, self.rec, self.max_running, self.budget = kv, rec, max_running, budget
        self.waiting: deque[_Slot] = deque()
        self.running: list[_Slot] = []
        self.finished: set[str] = set()

    def run(self, requests) -> None:
        self.waiting.extend(_Slot(r) for r in requests)
        while self.waiting or self.running:
            budget, preempted = self._serve_running()
            if not preempted:
                self._admit(budget)
            self._finish_done()
        self.rec.add("replayed", sorted(self.finished))

    def _allocate(self, req: Request, n: int, hit: int = 0, blocks=None):
        out = self.kv.allocate_slots(req, n, hit, blocks)
        self.rec.add("allocate", req.request_id, n, hit, _ids(out))
        if out is not None:
            req.num_computed_tokens += hit + n
            self.rec.add("held", self.kv.get_block_ids(req.request_id),
                         self.kv.get_retained_block_ids(req.request_id))
        return out

    def _serve_running(self) -> tuple[int, bool]:
        budget, i = self.budget, 0
        while i < len(self.running) and budget > 0:
            s = self.running[i]
            req = s.req
            if req.num_computed_tokens == req.num_tokens and s.appended < len(s.output):
                req.append_output_token_ids(s.output[s.appended])
                s.appended += 1
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n == 0 or self._allocate(req, n) is not None:
                budget -= n
                i += 1
                continue
            victim = self.running.pop()
            self.kv.free(victim.req)
            victim.req.num_computed_tokens = 0
            self.waiting.appendleft(victim)
            self.rec.add("preempt", victim.req.request_id, self.kv.num_free_blocks)
            return budget, True
        return budget, False

    def _admit(self, budget: int) -> None:
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            s = self.waiting[0]
            if s.after is not None and s.after not in self.finished:
                return
            blocks, hit = self.kv.get_computed_blocks(s.req)
            self.rec.add("lookup", s.req.request_id, hit, _ids(blocks))
            n = min(s.req.num_tokens - hit, budget)
            if self._allocate(s.req, n, hit, blocks if hit else None) is None:
                return
            self.waiting.popleft()
            budget -= n
            self.running.append(s)

    def _finish_done(self) -> None:
        still = []
        for s in self.running:
            if not s.done:
                still.append(s)
                continue
            self.kv.free(s.req)
            self.finished.add(s.req.request_id)
            self.rec.add("free", s.req.request_id, self.kv.num_free_blocks)
        self.running = still


REFUSED = object()  # an allocation the pool could never supply


class RandomTraffic:
    """Seeded random scheduler actions on a small pool (see the module docstring)."""

    VOCAB = 5

    def __init__(self, groups: list[KVCacheGroupSpec], policy: str, seed: int,
                 rec: Recorder) -> None:
        self.rng = random.Random(seed)
        self.rec = rec
        block = max(g.kv_cache_spec.block_size for g in groups)
        num_blocks = self.rng.choice((8, 14, 24)) * len(groups) + 2 * block
        self.kv = KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy=policy,
                                 hash_algo=self.rng.choice(("sha256", "xxhash")),
                                 warn_repeated_misses=False)
        if seed % 2 == 0:
            rec.listen(self.kv)
        self.bases = [[self.rng.randrange(self.VOCAB) for _ in range(80)] for _ in range(3)]
        self.waiting: list[tuple[Request, int]] = []  # (request, output tokens left)
        self.running: dict[str, list] = {}  # id -> [request, output left, hit pending]
        self.next_id = 0

    def run(self, steps: int) -> None:
        actions = (self.new, self.admit, self.advance, self.advance, self.advance,
                   self.finish, self.preempt, self.evict, self.reset)
        weights = (4, 4, 8, 8, 8, 5, 1, 1, 1)
        for _ in range(steps):
            self.rng.choices(actions, weights)[0]()
        for rid in list(self.running):
            self._free(rid, "free")
        self.rec.final_state(self.kv)

    def new(self) -> None:
        rng = self.rng
        base = rng.choice(self.bases)
        prompt = base[:rng.randrange(1, 60)] + [rng.randrange(self.VOCAB)
                                               for _ in range(rng.randrange(0, 12))]
        salt = rng.choice((None, None, "s1"))
        lora = rng.choice((None, None, None, "l1"))
        req = Request(f"r{self.next_id}", prompt, cache_salt=salt, lora_name=lora)
        self.next_id += 1
        self.waiting.append((req, rng.randrange(0, 24)))

    def admit(self) -> None:
        if not self.waiting:
            return
        req, out = self.waiting[0]
        blocks, hit = self.kv.get_computed_blocks(req)
        self.rec.add("lookup", req.request_id, hit, _ids(blocks))
        n = min(req.num_tokens - hit, self.rng.randrange(1, 40))
        new = self._allocate(req, n, hit, blocks if hit else None)
        if new is REFUSED:
            self.waiting.pop(0)  # it can never run: the scheduler drops it
        elif new is not None:
            self.waiting.pop(0)
            req.num_computed_tokens += hit + n
            self.running[req.request_id] = [req, out]

    def advance(self) -> None:
        if not self.running:
            return
        entry = self.running[self.rng.choice(list(self.running))]
        req = entry[0]
        if req.num_computed_tokens == req.num_tokens:
            if not entry[1]:
                return
            entry[1] -= 1
            token = self.rng.randrange(self.VOCAB)
            req.append_output_token_ids(self.rng.choice((token, [token])))
        n = min(req.num_tokens - req.num_computed_tokens, self.rng.randrange(1, 20))
        if self.rng.random() < 0.05:
            n = 0
        new = self._allocate(req, n, 0, None)
        if new is REFUSED:
            self._free(req.request_id, "abort")
        elif new is not None:
            req.num_computed_tokens += n

    def _allocate(self, req: Request, n: int, hit: int, blocks):
        try:
            out = self.kv.allocate_slots(req, n, hit, blocks)
        except ValueError as error:
            self.rec.add("refused", req.request_id, str(error))
            return REFUSED
        self.rec.add("allocate", req.request_id, n, hit, _ids(out))
        if out is not None:
            self.rec.add("held", self.kv.get_block_ids(req.request_id),
                         self.kv.get_retained_block_ids(req.request_id))
        elif self.running and self.rng.random() < 0.7:
            self.preempt()
        return out

    def finish(self) -> None:
        done = [rid for rid, (req, out) in self.running.items()
                if not out and req.num_computed_tokens == req.num_tokens]
        if done:
            self._free(self.rng.choice(done), "free")

    def preempt(self) -> None:
        if self.running:
            rid = list(self.running)[-1]
            req, out = self.running[rid]
            self._free(rid, "preempt")
            req.num_computed_tokens = 0
            self.waiting.insert(0, (req, out))

    def _free(self, rid: str, what: str) -> None:
        req = self.running.pop(rid)[0]
        self.kv.free(req)
        self.rec.add(what, rid, self.kv.num_free_blocks)

    def evict(self) -> None:
        ids = self.rng.sample(range(self.kv.pool.num_blocks), 2)
        self.kv.evict_blocks(ids)
        self.rec.add("evict_blocks", ids)

    def reset(self) -> None:
        if self.rng.random() < 0.3:
            self.rec.add("reset", self.kv.reset_prefix_cache())


