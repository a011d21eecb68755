"""A continuous-batching driver that replays a trace through a KV cache.

Each step runs the running requests first (one decode token each, or their
next prefill chunk), then admits waiting requests in arrival order while
the step's token budget and the cap on running requests allow. When an
allocation fails the most recently admitted running request is preempted
(its blocks freed; it recomputes later, from whatever is still cached).
Decode appends the trace's output tokens one per step, so what a request
leaves cached is the same whichever cache serves it.

The driver talks to a `CacheAdapter`; `ManagerAdapter` is the one over
`KVCacheManager`, and `hybridkv.testing.ideal.ClairvoyantCache` is a
clairvoyant one, so a real policy and the yardstick see the same schedule
rules. The hit rate is the tokens reused at each request's first admission
over its prompt tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hybridkv.kv_cache.kv_cache_manager import KVCacheBlocks, KVCacheManager
from hybridkv.kv_cache.request import Request


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


@dataclass
class ReplayStats:
    steps: int = 0
    finished: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0  # at first admissions
    hit_tokens: int = 0  # reused at first admissions

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class _Slot:
    __slots__ = ("req", "handle", "computed", "appended", "counted")

    def __init__(self, req: TraceLike) -> None:
        self.req = req
        self.handle: Any = None
        self.computed = 0
        self.appended = 0  # output tokens given to the request so far
        self.counted = False

    @property
    def known(self) -> int:
        return len(self.req.prompt) + self.appended


def replay(requests: Sequence[TraceLike], cache: CacheAdapter, *, max_running: int,
           token_budget: int = 8192) -> ReplayStats:
    """Run every request to its last output token; return the counts.

    Raises RuntimeError when a request cannot run even with nothing else
    running (the pool is too small for it).
    """
    stats = ReplayStats()
    waiting = deque(_Slot(r) for r in requests)
    running: list[_Slot] = []
    while waiting or running:
        stats.steps += 1
        budget, preempted = _run_step(running, waiting, cache, token_budget, stats)
        if not preempted:
            _admit(running, waiting, cache, budget, max_running, stats)
        if not running and waiting and not preempted:
            raise RuntimeError(f"request {waiting[0].req.request_id!r} does not fit in the "
                               f"pool even alone")
        done = [s for s in running if s.appended == len(s.req.output) and s.computed == s.known]
        for s in done:
            cache.free(s.handle)
            stats.finished += 1
        if done:
            running[:] = [s for s in running if s not in done]
    return stats


def _run_step(running: list[_Slot], waiting: deque[_Slot], cache: CacheAdapter,
              budget: int, stats: ReplayStats) -> tuple[int, bool]:
    preempted, i = False, 0
    while i < len(running) and budget > 0:
        s = running[i]
        if s.computed == s.known and s.appended < len(s.req.output):
            cache.append(s.handle, s.req.output[s.appended])  # the previous step's sample
            s.appended += 1
        n = min(s.known - s.computed, budget)
        if n == 0:
            i += 1
            continue
        if cache.allocate(s.handle, n):
            s.computed += n
            budget -= n
            i += 1
            continue
        victim = running.pop()  # the most recently admitted
        cache.preempt(victim.handle)
        victim.computed = 0
        waiting.appendleft(victim)
        stats.preemptions += 1
        preempted = True
    return budget, preempted


def _admit(running: list[_Slot], waiting: deque[_Slot], cache: CacheAdapter, budget: int,
           max_running: int, stats: ReplayStats) -> None:
    while waiting and len(running) < max_running and budget > 0:
        s = waiting[0]
        if s.handle is None:
            s.handle = cache.start(s.req)
        hit = cache.lookup(s.handle)
        n = min(s.known - hit, budget)
        if not cache.allocate(s.handle, n):
            return
        waiting.popleft()
        if not s.counted:
            s.counted = True
            stats.prompt_tokens += len(s.req.prompt)
            stats.hit_tokens += hit
        s.computed = hit + n
        budget -= n
        running.append(s)


class ManagerAdapter:
    """`CacheAdapter` over a `KVCacheManager` (its public API only)."""

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self._hits: dict[str, tuple[KVCacheBlocks, int]] = {}

    def start(self, req: TraceLike) -> Request:
        return Request(req.request_id, list(req.prompt))

    def lookup(self, request: Request) -> int:
        blocks, n = self.manager.get_computed_blocks(request)
        self._hits[request.request_id] = (blocks, n)
        return n

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        hit = self._hits.pop(request.request_id, None)
        if hit is not None and hit[1]:
            out = self.manager.allocate_slots(request, num_new_tokens, hit[1], hit[0])
        else:
            out = self.manager.allocate_slots(request, num_new_tokens)
        if out is None:
            return False
        request.num_computed_tokens += num_new_tokens + (hit[1] if hit else 0)
        return True

    def append(self, request: Request, token: int) -> None:
        request.append_output_token_ids(token)

    def free(self, request: Request) -> None:
        self.manager.free(request)

    def preempt(self, request: Request) -> None:
        self.manager.free(request)
        request.num_computed_tokens = 0
