"""Continuous batching with chunked prefill over the KVCacheManager.

Each step: running requests first (one decode token, or their next prefill
chunk), then waiting requests in arrival order, all within a token budget.
When the pool runs dry the most recently admitted running request is
preempted: its blocks are freed and it later recomputes its tokens (cached
blocks usually make that cheap). The manager decides what is reused.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hybridkv.engine.sampling import SamplingParams, TokenLogprobs
from hybridkv.kv_cache.checks import check_int
from hybridkv.kv_cache.kv_cache_manager import KVCacheBlocks, KVCacheManager
from hybridkv.kv_cache.request import Request

if TYPE_CHECKING:
    from hybridkv.store.tier import KVTier


@dataclass(eq=False)
class SeqState:
    """A request inside the engine: tokens, sampling, progress, outcome."""

    request: Request
    params: SamplingParams
    index: int  # position in the generate() call
    num_cached_tokens: int = -1  # prefix hit at first admission (-1: not admitted yet)
    num_external_cached_tokens: int = 0  # of those, reused because a KV store held them
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    error: str | None = None  # what failed while handling this request alone
    # one per sampled output token when params.logprobs is not None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    # one per prompt token (the first None) when params.prompt_logprobs is not None;
    # complete by the time the first output token is sampled
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_preemptions: int = 0
    # time.perf_counter() at the generate() call, the first sampled token, the finish
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_output_tokens(self) -> int:
        return self.request.num_tokens - self.request.num_prompt_tokens


@dataclass
class ScheduledSeq:
    """One request's share of a step: tokens [num_computed, num_computed + num_new)."""

    seq: SeqState
    num_computed: int  # tokens with KV/state in place, including a fresh cache hit
    num_new: int

    @property
    def samples(self) -> bool:
        """Whether the step's last token of this request produces a new token."""
        return self.num_computed + self.num_new == self.seq.request.num_tokens


TRACE_STEPS = 1 << 16  # steps the usage and token traces keep


@dataclass
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    scheduled_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    external_cached_tokens: int = 0
    max_running: int = 0
    failed: int = 0  # requests ended with finish_reason "error"
    # pool usage after each schedule, and tokens of the scheduled sequences: the last
    # TRACE_STEPS steps only, so a long-running server does not grow with them
    usage_trace: deque[float] = field(default_factory=lambda: deque(maxlen=TRACE_STEPS))
    tokens_trace: deque[int] = field(default_factory=lambda: deque(maxlen=TRACE_STEPS))


class Scheduler:
    """Decides, each step, which tokens of which requests are computed."""

    def __init__(self, kv_cache_manager: KVCacheManager, *, max_num_seqs: int = 32,
                 max_num_batched_tokens: int = 2048, tier: KVTier | None = None) -> None:
        for name, value in (("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            check_int(name, value, 1)
        self.kv = kv_cache_manager
        self.tier = tier  # a KV store behind the pool: hits the pool lacks are imported
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []
        self.stats = SchedulerStats()

    def add(self, seq: SeqState) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        """Allocate slots for this step's tokens; return them in batch order."""
        self.stats.steps += 1
        budget = self.max_num_batched_tokens
        batch: list[ScheduledSeq] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            req = seq.request
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if self.kv.allocate_slots(req, n) is None:
                preempted = True
                if self._preempt_last() is seq:
                    break
                continue
            batch.append(ScheduledSeq(seq, req.num_computed_tokens, n))
            budget -= n
            i += 1
        if not preempted:
            budget = self._admit(batch, budget)
        self.stats.scheduled_tokens += self.max_num_batched_tokens - budget
        self.stats.max_running = max(self.stats.max_running, len(self.running))
        self.stats.usage_trace.append(self.kv.usage)
        self.stats.tokens_trace.append(sum(item.num_computed + item.num_new for item in batch))
        return batch

    def _admit(self, batch: list[ScheduledSeq], budget: int) -> int:
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            req = seq.request
            try:
                found = self._lookup(seq, budget)
            except Exception as error:  # a store failing on this request fails it alone
                self.fail(seq, f"KV cache lookup failed: {type(error).__name__}: {error}")
                continue
            if found is None:  # the store's longer hit does not fit yet
                break
            blocks, hit = found
            n = min(req.num_tokens - hit, budget)
            if self.kv.allocate_slots(req, n, hit, blocks if hit else None) is None:
                break
            self.waiting.popleft()
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = hit
                seq.num_external_cached_tokens = min(seq.num_external_cached_tokens, hit)
                self.stats.prompt_tokens += req.num_prompt_tokens
                self.stats.cached_tokens += hit
                self.stats.external_cached_tokens += seq.num_external_cached_tokens
            req.num_computed_tokens = hit  # the hit is in place before the step runs
            batch.append(ScheduledSeq(seq, hit, n))
            self.running.append(seq)
            budget -= n
        return budget

    def _lookup(self, seq: SeqState, budget: int) -> tuple[KVCacheBlocks | None, int] | None:
        """(blocks, tokens) of the prefix `seq` can reuse, from the pool and the
        store; None when the store's longer hit must wait for room. A request
        that still needs its prompt logprobs reuses nothing (it computes every
        prompt position)."""
        req = seq.request
        if seq.params.prompt_logprobs is not None and seq.num_output_tokens == 0:
            return None, 0
        blocks, hit = self.kv.get_computed_blocks(req)
        if self.tier is None:
            return blocks, hit
        tier_hit = self.tier.extend_hit(req, blocks, hit, budget, bool(self.running))
        if tier_hit.must_wait:
            return None
        if seq.num_cached_tokens < 0:  # (imports stay in the pool if it must wait)
            seq.num_external_cached_tokens = max(seq.num_external_cached_tokens,
                                                 tier_hit.num_external_tokens)
        return tier_hit.blocks, tier_hit.num_tokens

    def _preempt_last(self) -> SeqState:
        victim = self.running.pop()
        self.kv.free(victim.request)
        victim.request.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def finish_step(self, batch: list[ScheduledSeq]) -> None:
        """Advance computed counts after the model ran the step."""
        for item in batch:
            item.seq.request.num_computed_tokens = item.num_computed + item.num_new

    def finish(self, seq: SeqState, reason: str) -> None:
        """A running request is done: free its blocks (cached ones stay reusable)."""
        seq.finish_reason = reason
        self.running.remove(seq)
        self.kv.free(seq.request)

    def fail(self, seq: SeqState, message: str) -> None:
        """End a waiting or running request with finish_reason "error" and
        `seq.error = message`, freeing what it holds; the others go on."""
        seq.error = message
        seq.finished_time = time.perf_counter()
        self.stats.failed += 1
        self._drop(seq, "error")

    def abort(self, request_id: str) -> SeqState | None:
        """Drop a waiting (never admitted, or preempted) or running (prefilling
        or decoding) request, freeing the blocks it holds; None when no
        unfinished request has that id (unknown, finished, aborted already)."""
        for queue in (self.waiting, self.running):
            for seq in queue:
                if seq.request_id == request_id:
                    self._drop(seq, "abort")
                    return seq
        return None

    def _drop(self, seq: SeqState, reason: str) -> None:
        # Invariant: a running request holds blocks; a waiting one holds none
        # (admission allocates as it moves a request to running; preemption
        # frees as it moves one back).
        if seq in self.running:
            self.running.remove(seq)
            self.kv.free(seq.request)
        else:
            self.waiting.remove(seq)
        seq.finish_reason = reason
