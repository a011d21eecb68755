"""Replay of a token trace through a KV cache manager, timing every manager call.

A small continuous-batching scheduler drives the manager the way an engine
would, with no model: each step first serves the running requests (in
admission order: the next prefill chunk, or one decode token), then admits
waiting requests first come first served while a running slot and token
budget remain, then frees the requests that are done. An allocation that
does not fit preempts the most recently admitted running request (it
re-prefills later, after a fresh lookup); an admission that does not fit
ends admission for the step, and so does a request whose `after` request
(the previous turn of its chat) has not finished yet. The hit rate counts,
per request, the cached tokens found when it was first admitted over its
prompt length.

The driver sees the manager through `ManagerAdapter` (the public
`KVCacheManager` API only) and times only those calls, so requests/s is the
manager's cost plus a fixed driver overhead. An adapter for another manager
may add two hooks its scheduler needs: `new_step()`, called (and timed) at
the start of every step, and `clip_chunk(handle, n)`, the number of the next
`n` tokens the manager lets one step compute (0: none this step; a running
request then waits, an admission ends the step's admissions).

    >>> from hybridkv.tools.bench_traces import shared_prefix_trace
    >>> trace = shared_prefix_trace(num_requests=8, prefix_len=64, unique_len=16,
    ...                             decode_steps=4)
    >>> res = replay(trace, ManagerAdapter(make_config("full", 64)), max_running=4)
    >>> res.finished, round(res.hit_rate, 3)
    (8, 0.7)
"""

from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import dataclass, field

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from hybridkv.tools.bench_traces import Trace, TraceRequest

BLOCK_SIZE = 16
WINDOW = 1024
CONFIG_GROUPS = {"full": 1, "swa": 2, "mamba": 2}
TIMED_CALLS = ("start", "lookup", "allocate_prefill", "append", "allocate_decode", "free",
               "preempt", "new_step")


def make_config(kind: str, num_blocks: int, window: int = WINDOW,
                block_size: int = BLOCK_SIZE) -> KVCacheConfig:
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


class ManagerAdapter:
    """The driver's view of a `KVCacheManager`: one method per scheduler action."""

    def __init__(self, config: KVCacheConfig, *, hash_algo: str = "sha256",
                 eviction_policy: str | None = None) -> None:
        kwargs = {"eviction_policy": eviction_policy} if eviction_policy else {}
        self.manager = KVCacheManager(config, hash_algo=hash_algo, **kwargs)
        self._hits: dict[str, tuple] = {}

    def start(self, tr: TraceRequest) -> Request:
        return Request(tr.request_id, list(tr.prompt_token_ids))

    def lookup(self, req: Request) -> int:
        """Cached tokens of the longest reusable prefix (kept for the next allocation)."""
        blocks, num_cached = self.manager.get_computed_blocks(req)
        self._hits[req.request_id] = (blocks, num_cached)
        return num_cached

    def allocate(self, req: Request, num_tokens: int) -> bool:
        """Slots for `num_tokens` more tokens (after the hit of the last lookup)."""
        blocks, num_cached = self._hits.pop(req.request_id, (None, 0))
        if self.manager.allocate_slots(req, num_tokens, num_cached, blocks) is None:
            return False
        req.num_computed_tokens += num_cached + num_tokens
        return True

    def append(self, req: Request, token_id: int) -> None:
        req.append_output_token_ids(token_id)

    def free(self, req: Request) -> None:
        self.manager.free(req)

    def preempt(self, req: Request) -> None:
        self.manager.free(req)
        req.num_computed_tokens = 0

    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks


@dataclass
class ReplayResult:
    """What a replay measured; per-call times in nanoseconds."""

    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time over the same span (steadier on a busy machine)
    steps: int = 0
    finished: int = 0
    preemptions: int = 0
    failed_admissions: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    min_free_blocks: int = -1
    call_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIMED_CALLS, 0))
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIMED_CALLS, 0))
    request_hits: dict[str, int] = field(default_factory=dict)  # cached tokens at admission

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

    __slots__ = ("tr", "handle", "computed", "appended", "counted")

    def __init__(self, tr: TraceRequest) -> None:
        self.tr = tr
        self.handle: Request | None = None
        self.computed = 0  # tokens with KV slots
        self.appended = 0  # decode tokens appended
        self.counted = False  # hit counted (first admission)

    @property
    def known(self) -> int:
        return len(self.tr.prompt_token_ids) + self.appended

    @property
    def done(self) -> bool:
        return self.appended == len(self.tr.decode_token_ids) and self.computed == self.known


class _Driver:
    """One replay: the queues, the step loop and the timed calls."""

    def __init__(self, trace: Trace, adapter: ManagerAdapter, max_running: int,
                 max_batched_tokens: int) -> None:
        self.adapter = adapter
        self.max_running = max_running
        self.max_batched_tokens = max_batched_tokens
        self.waiting = deque(_Slot(tr) for tr in trace.requests)
        self.running: list[_Slot] = []
        self.finished_ids: set[str] = set()
        self.res = ReplayResult()
        self.new_step = getattr(adapter, "new_step", None)
        self.clip_chunk = getattr(adapter, "clip_chunk", None)

    def call(self, name: str, fn, *args):
        t0 = time.perf_counter_ns()
        out = fn(*args)
        self.res.call_ns[name] += time.perf_counter_ns() - t0
        self.res.calls[name] += 1
        return out

    def step(self) -> None:
        self.res.steps += 1
        if self.new_step is not None:
            self.call("new_step", self.new_step)
        budget = self.max_batched_tokens
        budget, preempted = self._serve_running(budget)
        if not preempted:
            self._admit(budget)
            if not self.running and self.waiting and self._can_start(self.waiting[0]):
                raise ValueError(f"request {self.waiting[0].tr.request_id} does not fit the "
                                 f"empty pool ({self.adapter.num_free_blocks()} free blocks)")
        self._finish_done()
        free = self.adapter.num_free_blocks()
        if self.res.min_free_blocks < 0 or free < self.res.min_free_blocks:
            self.res.min_free_blocks = free

    def _serve_running(self, budget: int) -> tuple[int, bool]:
        """A prefill chunk or one decode token per running request, in admission order."""
        preempted, i = False, 0
        while i < len(self.running) and budget > 0:
            slot = self.running[i]
            n = self._schedule(slot, budget)
            if n is None:  # the manager allows no tokens this step
                i += 1
                continue
            if n > 0:
                budget -= n
                i += 1
                continue
            preempted = True
            if self._preempt_last() is slot:
                continue  # slot itself left; the next one moved to index i
        return budget, preempted

    def _schedule(self, slot: _Slot, budget: int) -> int | None:
        """Allocate the slot's next tokens; how many, 0 when they did not fit, None
        when `clip_chunk` allowed none.

        A decode step first appends the token the previous step sampled; when
        its slot did not fit, the retry allocates only that token.
        """
        if slot.computed == slot.known:
            self.call("append", self.adapter.append, slot.handle,
                      slot.tr.decode_token_ids[slot.appended])
            slot.appended += 1
        n = min(slot.known - slot.computed, budget)
        if self.clip_chunk is not None:
            n = self.clip_chunk(slot.handle, n)
            if n == 0:
                return None
        decode = slot.appended > 0 and 0 < slot.computed == slot.known - 1
        name = "allocate_decode" if decode else "allocate_prefill"
        if not self.call(name, self.adapter.allocate, slot.handle, n):
            return 0
        slot.computed += n
        return n

    def _preempt_last(self) -> _Slot:
        victim = self.running.pop()
        self.call("preempt", self.adapter.preempt, victim.handle)
        self.res.preemptions += 1
        victim.computed = 0
        self.waiting.appendleft(victim)
        return victim

    def _admit(self, budget: int) -> None:
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            slot = self.waiting[0]
            if not self._can_start(slot):
                return
            if slot.handle is None:
                slot.handle = self.call("start", self.adapter.start, slot.tr)
            hit = self.call("lookup", self.adapter.lookup, slot.handle)
            n = min(slot.known - hit, budget)
            if self.clip_chunk is not None:
                n = self.clip_chunk(slot.handle, n)
                if n == 0:
                    return
            if not self.call("allocate_prefill", self.adapter.allocate, slot.handle, n):
                self.res.failed_admissions += 1
                return
            self.waiting.popleft()
            if not slot.counted:
                slot.counted = True
                self.res.prompt_tokens += len(slot.tr.prompt_token_ids)
                self.res.hit_tokens += hit
                self.res.request_hits[slot.tr.request_id] = hit
            slot.computed = hit + n
            budget -= n
            self.running.append(slot)

    def _can_start(self, slot: _Slot) -> bool:
        return slot.tr.after is None or slot.tr.after in self.finished_ids

    def _finish_done(self) -> None:
        still = []
        for slot in self.running:
            if slot.done:
                self.call("free", self.adapter.free, slot.handle)
                self.finished_ids.add(slot.tr.request_id)
                self.res.finished += 1
            else:
                still.append(slot)
        self.running = still


def replay(trace: Trace, adapter: ManagerAdapter, *, max_running: int = 64,
           max_batched_tokens: int = 8192, time_budget_s: float | None = None) -> ReplayResult:
    """Run every request of `trace` through `adapter`; stops early past `time_budget_s`."""
    if max_running < 1 or max_batched_tokens < 1:
        raise ValueError(f"max_running and max_batched_tokens must be >= 1, got "
                         f"{max_running}, {max_batched_tokens}")
    driver = _Driver(trace, adapter, max_running, max_batched_tokens)
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    while driver.waiting or driver.running:
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            break
        driver.step()
    driver.res.wall_s = time.perf_counter() - t0
    driver.res.cpu_s = time.process_time() - c0
    return driver.res
