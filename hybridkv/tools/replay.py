"""A continuous-batching driver that replays a trace through a KV cache.

Each step first serves the running requests in admission order (one decode
token each, or their next prefill chunk), then admits waiting requests in
arrival order while a running slot and the step's token budget remain,
then frees the requests that are done. An allocation that does not fit
preempts the most recently admitted running request (its blocks freed; it
recomputes later, after a fresh lookup, from whatever is still cached); an
admission that does not fit ends admission for the step, and so does a
request whose `after` request (the previous turn of its chat) has not
finished yet. Decode appends the trace's output tokens one per step, so
what a request leaves cached is the same whichever cache serves it.

The driver talks to a `CacheAdapter`: `ManagerAdapter` is the one over
`KVCacheManager` (its public API only), and
`hybridkv.tools.ideal.ClairvoyantCache` is a clairvoyant one, so a real
policy and the yardstick see the same schedule rules. The hit rate counts
the tokens reused at each request's first admission over its prompt tokens.
With `timed=True` every adapter call is timed, so requests/s is the cache's
cost plus a fixed driver overhead. Adapters for other managers may add the
hooks their scheduler needs (`new_step`, `clip_chunk`; see `replay`).

    >>> from hybridkv.tools.bench_traces import shared_prefix_trace
    >>> trace = shared_prefix_trace(num_requests=8, prefix_len=64, unique_len=16,
    ...                             decode_steps=4)
    >>> adapter = ManagerAdapter(KVCacheManager(make_config("full", 64)))
    >>> res = replay(trace.requests, adapter, max_running=4)
    >>> res.finished, round(res.hit_rate, 3)
    (8, 0.7)
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec

CONFIG_GROUPS = {"full": 1, "swa": 2, "mamba": 2}
TIMED_CALLS = ("start", "lookup", "allocate_prefill", "append", "allocate_decode", "free",
               "preempt", "new_step")


class TraceLike(Protocol):
    request_id: str
    prompt: Sequence[int]
    output: Sequence[int]


class CacheAdapter(Protocol):
    """What the driver needs from a KV cache."""

    def start(self, req: TraceLike) -> Any:
        """A handle for a request about to be looked up the first time."""

    def lookup(self, handle: Any) -> int:
        """Tokens the cache can reuse now (remembered for the next `allocate`)."""

    def allocate(self, handle: Any, num_new_tokens: int) -> bool:
        """Slots for the next tokens (after the hit of the last lookup when the request
        holds nothing); False, changing nothing, when the pool cannot supply them."""

    def append(self, handle: Any, token: int) -> None:
        """One decoded token joins the request."""

    def free(self, handle: Any) -> None:
        """The request is done; its blocks go back (cached ones stay reusable)."""

    def preempt(self, handle: Any) -> None:
        """Free the request's blocks; it starts again from 0 later."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (evictable cached ones included)."""


def make_config(kind: str, num_blocks: int, *, block_size: int = 16,
                window: int = 1024) -> KVCacheConfig:
    """`full` (one full-attention group), `swa` (+ a sliding window) or `mamba` (+ Mamba)."""
    if kind not in CONFIG_GROUPS:
        raise ValueError(f"config {kind!r} is unknown; use one of {', '.join(CONFIG_GROUPS)}")
    groups = [KVCacheGroupSpec(["full.0"], FullAttentionSpec(block_size=block_size))]
    if kind == "swa":
        spec = SlidingWindowSpec(block_size=block_size, sliding_window=window)
        groups.append(KVCacheGroupSpec(["swa.0"], spec))
    elif kind == "mamba":
        groups.append(KVCacheGroupSpec(["mamba.0"], MambaSpec(block_size=block_size)))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=groups)


@dataclass
class ReplayStats:
    """What a replay measured; per-call times (nanoseconds) only when timed."""

    steps: int = 0
    finished: int = 0
    preemptions: int = 0
    failed_admissions: int = 0
    prompt_tokens: int = 0  # at first admissions
    hit_tokens: int = 0  # reused at first admissions
    min_free_blocks: int = -1
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time over the same span (steadier on a busy machine)
    request_hits: dict[str, int] = field(default_factory=dict)  # cached tokens at admission
    call_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIMED_CALLS, 0))
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIMED_CALLS, 0))

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.finished / self.wall_s if self.wall_s else 0.0

    @property
    def requests_per_cpu_s(self) -> float:
        return self.finished / self.cpu_s if self.cpu_s else 0.0

    def mean_us(self, call: str) -> float:
        return self.call_ns[call] / self.calls[call] / 1e3 if self.calls[call] else 0.0

    def as_dict(self) -> dict:
        out = {"wall_s": round(self.wall_s, 4), "requests_per_s": round(self.requests_per_s, 1),
               "cpu_s": round(self.cpu_s, 4),
               "requests_per_cpu_s": round(self.requests_per_cpu_s, 1),
               "hit_rate": round(self.hit_rate, 5), "steps": self.steps,
               "finished": self.finished, "preemptions": self.preemptions,
               "failed_admissions": self.failed_admissions,
               "min_free_blocks": self.min_free_blocks,
               "manager_s": round(sum(self.call_ns.values()) / 1e9, 4)}
        out.update({f"{c}_mean_us": round(self.mean_us(c), 3) for c in TIMED_CALLS})
        return out


class _Slot:
    """The driver's state of one request."""

    __slots__ = ("req", "handle", "computed", "appended", "counted")

    def __init__(self, req: TraceLike) -> None:
        self.req = req
        self.handle: Any = None
        self.computed = 0  # tokens with KV slots
        self.appended = 0  # output tokens given to the request so far
        self.counted = False  # hit counted (first admission)

    @property
    def known(self) -> int:
        return len(self.req.prompt) + self.appended

    @property
    def done(self) -> bool:
        return self.appended == len(self.req.output) and self.computed == self.known


class _Driver:
    """One replay: the queues, the step loop and the (optionally timed) adapter calls."""

    def __init__(self, requests: Sequence[TraceLike], cache: CacheAdapter, max_running: int,
                 max_batched_tokens: int, timed: bool) -> None:
        self.cache = cache
        self.max_running = max_running
        self.max_batched_tokens = max_batched_tokens
        self.stats = ReplayStats()
        self.call = self._timed_call if timed else self._call
        self.waiting = deque(_Slot(r) for r in requests)
        self.running: list[_Slot] = []
        self.finished_ids: set[str] = set()
        self.new_step = getattr(cache, "new_step", None)
        self.clip_chunk = getattr(cache, "clip_chunk", None)

    def _timed_call(self, name: str, fn, *args):
        t0 = time.perf_counter_ns()
        out = fn(*args)
        self.stats.call_ns[name] += time.perf_counter_ns() - t0
        self.stats.calls[name] += 1
        return out

    @staticmethod
    def _call(name: str, fn, *args):
        return fn(*args)

    def step(self) -> None:
        self.stats.steps += 1
        if self.new_step is not None:
            self.call("new_step", self.new_step)
        budget, preempted = self._serve_running(self.max_batched_tokens)
        if not preempted:
            self._admit(budget)
            if not self.running and self.waiting and self._can_start(self.waiting[0]):
                raise ValueError(f"request {self.waiting[0].req.request_id!r} does not fit "
                                 f"the pool even alone ({self.cache.num_free_blocks} free "
                                 f"blocks)")
        self._finish_done()
        free = self.cache.num_free_blocks
        if self.stats.min_free_blocks < 0 or free < self.stats.min_free_blocks:
            self.stats.min_free_blocks = free

    def _serve_running(self, budget: int) -> tuple[int, bool]:
        """A prefill chunk or one decode token per running request, in admission order;
        a failed allocation preempts the most recently admitted one and retries."""
        preempted, i = False, 0
        while i < len(self.running) and budget > 0:
            s = self.running[i]
            n = self._schedule(s, budget)
            if n is None or n > 0:  # None: the adapter allows no tokens this step
                budget -= n or 0
                i += 1
                continue
            victim = self.running.pop()
            self.call("preempt", self.cache.preempt, victim.handle)
            victim.computed = 0
            self.waiting.appendleft(victim)
            self.stats.preemptions += 1
            preempted = True
        return budget, preempted

    def _schedule(self, s: _Slot, budget: int) -> int | None:
        """Allocate the slot's next tokens: how many, 0 when they did not fit, None when
        `clip_chunk` allowed none. A decode step first appends the token the previous
        step sampled; when its slot did not fit, the retry allocates only that token."""
        if s.computed == s.known and s.appended < len(s.req.output):
            self.call("append", self.cache.append, s.handle, s.req.output[s.appended])
            s.appended += 1
        n = min(s.known - s.computed, budget)
        if n == 0:
            return None
        if self.clip_chunk is not None:
            n = self.clip_chunk(s.handle, n)
            if n == 0:
                return None
        decode = s.appended > 0 and 0 < s.computed == s.known - 1
        name = "allocate_decode" if decode else "allocate_prefill"
        if not self.call(name, self.cache.allocate, s.handle, n):
            return 0
        s.computed += n
        return n

    def _admit(self, budget: int) -> None:
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            s = self.waiting[0]
            if not self._can_start(s):
                return
            if s.handle is None:
                s.handle = self.call("start", self.cache.start, s.req)
            hit = self.call("lookup", self.cache.lookup, s.handle)
            n = min(s.known - hit, budget)
            if self.clip_chunk is not None:
                n = self.clip_chunk(s.handle, n)
                if n == 0:
                    return
            if not self.call("allocate_prefill", self.cache.allocate, s.handle, n):
                self.stats.failed_admissions += 1
                return
            self.waiting.popleft()
            if not s.counted:
                s.counted = True
                self.stats.prompt_tokens += len(s.req.prompt)
                self.stats.hit_tokens += hit
                self.stats.request_hits[s.req.request_id] = hit
            s.computed = hit + n
            budget -= n
            self.running.append(s)

    def _can_start(self, s: _Slot) -> bool:
        after = getattr(s.req, "after", None)
        return after is None or after in self.finished_ids

    def _finish_done(self) -> None:
        still = []
        for s in self.running:
            if s.done:
                self.call("free", self.cache.free, s.handle)
                self.finished_ids.add(s.req.request_id)
                self.stats.finished += 1
            else:
                still.append(s)
        self.running = still


def replay(requests: Sequence[TraceLike], cache: CacheAdapter, *, max_running: int = 64,
           max_batched_tokens: int = 8192, time_budget_s: float | None = None,
           timed: bool = False) -> ReplayStats:
    """Run every request to its last output token (or until `time_budget_s` passed);
    return the counts, and with `timed` the time of every adapter call.

    An adapter may add two hooks its scheduler needs: `new_step()`, called (and
    timed) at the start of every step, and `clip_chunk(handle, n)`, how many of the
    next `n` tokens one step may compute (0: none this step; a running request then
    waits, an admission ends the step's admissions).

    Raises ValueError when a request cannot run even with nothing else running
    (the pool is too small for it), naming the request.
    """
    if max_running < 1 or max_batched_tokens < 1:
        raise ValueError(f"max_running and max_batched_tokens must be >= 1, got "
                         f"{max_running}, {max_batched_tokens}")
    driver = _Driver(requests, cache, max_running, max_batched_tokens, timed)
    if timed:
        gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    while driver.waiting or driver.running:
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            break
        driver.step()
    driver.stats.wall_s = time.perf_counter() - t0
    driver.stats.cpu_s = time.process_time() - c0
    return driver.stats


class ManagerAdapter:
    """`CacheAdapter` over a `KVCacheManager` (its public API only)."""

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self._hits: dict[str, tuple] = {}

    def start(self, req: TraceLike) -> Request:
        return Request(req.request_id, list(req.prompt))

    def lookup(self, request: Request) -> int:
        """Cached tokens of the longest reusable prefix (kept for the next allocation)."""
        blocks, num_cached = self.manager.get_computed_blocks(request)
        self._hits[request.request_id] = (blocks, num_cached)
        return num_cached

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        """Slots for `num_new_tokens` more tokens (after the hit of the last lookup)."""
        blocks, num_cached = self._hits.pop(request.request_id, (None, 0))
        if self.manager.allocate_slots(request, num_new_tokens, num_cached, blocks) is None:
            return False
        request.num_computed_tokens += num_cached + num_new_tokens
        return True

    def append(self, request: Request, token: int) -> None:
        request.append_output_token_ids(token)

    def free(self, request: Request) -> None:
        self.manager.free(request)

    def preempt(self, request: Request) -> None:
        self.manager.free(request)
        request.num_computed_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks


__all__ = ["CONFIG_GROUPS", "TIMED_CALLS", "CacheAdapter", "ManagerAdapter", "ReplayStats",
           "TraceLike", "make_config", "replay"]
