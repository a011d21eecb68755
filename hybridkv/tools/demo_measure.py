"""The measurements behind `hybridkv demo`: caching on against caching off.

How every figure is taken, and why:

- One engine per mode (prefix caching on, off) per model, built once, with its
  KV pool written once at start-up as a long-running server's would be. The
  first run of every workload, and a first round of the TTFT sweep, are
  warm-up: on a virtual machine the first write to fresh memory costs 0.5-5 ms
  per MiB (256 MiB: 0.1-1.3 s, against 20-30 ms once mapped), and torch and
  the C allocator initialise lazily. Timed on its own, that cost lands on
  whichever mode happens to run first.
- Every run starts from an empty prefix cache (`reset_prefix_cache`), so with
  caching on a run earns its hits inside the workload, and every repeat does
  the same work and produces the same tokens.
- On and off runs alternate (on, off, off, on, ...), so a change in the load
  of a shared machine falls on both modes; a figure is the median of the
  repeats, reported with its range.
- The first (warm-up) run of each workload with caching on is also the
  accounting run: hit rates, the blocks each KV cache group holds and keeps,
  pool usage and memory all come from it (timed runs carry no instruments).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridkv.engine.llm import LLM
from hybridkv.engine.sampling import SamplingParams
from hybridkv.engine.scheduler import ScheduledSeq, Scheduler
from hybridkv.kv_cache.specs import AttentionSpec
from hybridkv.tools.workloads import ChatWorkload, GenerateFn, few_shot, shared_documents

BLOCK_SIZE = 16
NUM_BLOCKS = 2048
OUTPUT_LEN = 12
QUESTION_LEN = 24
WORKLOAD_PARAMS = SamplingParams(max_tokens=OUTPUT_LEN, ignore_eos=True)
TTFT_PARAMS = SamplingParams(max_tokens=1, ignore_eos=True)

Workload = Callable[[GenerateFn], list[list[int]]]


def _prompts_workload(prompts: list[list[int]]) -> Workload:
    return lambda generate: generate(prompts)


def demo_workloads() -> dict[str, Workload]:
    """The three workloads, prompts built once (outside every timed run)."""
    return {
        "shared documents": _prompts_workload(
            shared_documents(num_docs=3, doc_len=1024, questions_per_doc=4,
                             question_len=QUESTION_LEN)),
        "multi-turn chat": ChatWorkload(num_sessions=4, num_turns=4, system_len=256,
                                        user_len=64).run,
        "few-shot prompts": _prompts_workload(
            few_shot(header_len=1024, num_questions=10, question_len=QUESTION_LEN)),
    }


@dataclass
class Samples:
    """Repeated measurements of one figure."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)


@dataclass
class GroupUsage:
    """What one KV cache group did in a run: the tokens it alone could have
    reused (`prefix_cache_stats.group_hits`), the blocks a request held in it
    while decoding (mean over requests and steps; retained Mamba states
    included), and the most distinct blocks all running requests held in it
    at once (a chunked prefill of 2,048 tokens holds all its blocks for the step)."""

    reusable_tokens: int
    blocks_per_request: float
    peak_blocks: int


@dataclass
class WorkloadResult:
    name: str
    num_requests: int
    rate_on: Samples  # requests/s with prefix caching
    rate_off: Samples  # requests/s without
    identical: bool  # every run's tokens equal the first caching-off run's
    hit_rate: float  # prompt tokens reused / prompt tokens
    groups: list[GroupUsage]
    usage_trace: list[float]  # pool usage after each step of the accounting run
    peak_bytes: int  # most KV bytes held at once (caching on)
    full_attention_bytes: int  # what all-full-attention layers would hold for the same tokens

    @property
    def speedup(self) -> float:
        """Median requests/s with caching on over the median with it off."""
        return self.rate_on.median / self.rate_off.median


@dataclass
class TTFTPoint:
    """Time to first token for one shared-prefix length (seconds)."""

    prefix_len: int
    reused: float  # fraction of the hit prompt taken from the cache
    miss: Samples = field(default_factory=Samples)  # caching on, nothing cached yet
    hit: Samples = field(default_factory=Samples)  # caching on, the prefix cached
    off: Samples = field(default_factory=Samples)  # caching off


def make_engines(model) -> dict[bool, LLM]:
    """{True: caching on, False: off}, same pool, every page written once."""
    engines = {caching: LLM(model, enable_prefix_caching=caching, block_size=BLOCK_SIZE,
                            num_blocks=NUM_BLOCKS, max_num_batched_tokens=2048)
               for caching in (True, False)}
    for llm in engines.values():
        for tensors in llm.executor.kv_views.values():
            for tensor in tensors:
                tensor.zero_()
    return engines


def run_once(llm: LLM, workload: Workload) -> tuple[list[list[int]], float]:
    """One run from an empty prefix cache: (output tokens, seconds)."""
    if not llm.kv.reset_prefix_cache():
        raise RuntimeError("the prefix cache could not be reset: a request still holds blocks")

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        return [out.output_token_ids for out in llm.generate(prompts, WORKLOAD_PARAMS)]

    start = time.perf_counter()
    outputs = workload(generate)
    return outputs, time.perf_counter() - start


def measure_workload(engines: dict[bool, LLM], name: str, workload: Workload,
                     repeats: int) -> WorkloadResult:
    """Warm-up and accounting run, then `repeats` alternating timed runs per mode."""
    on = engines[True]
    account = _account(on, workload)
    reference, _ = run_once(engines[False], workload)
    identical = account.outputs == reference
    rates = {True: Samples(), False: Samples()}
    for repeat in range(repeats):
        for caching in ((True, False) if repeat % 2 == 0 else (False, True)):
            outputs, seconds = run_once(engines[caching], workload)
            identical = identical and outputs == reference
            rates[caching].values.append(len(outputs) / seconds)
    return WorkloadResult(name, len(reference), rates[True], rates[False], identical,
                          account.hit_rate, account.groups, list(account.usage_trace),
                          *_memory(on, account.usage_trace, account.tokens_trace))


class _MeteredScheduler(Scheduler):
    """A scheduler that counts, after each schedule, the blocks per group held by
    each decoding request and the distinct blocks held by all running requests."""

    def __init__(self, base: Scheduler) -> None:
        super().__init__(base.kv, max_num_seqs=base.max_num_seqs,
                         max_num_batched_tokens=base.max_num_batched_tokens)
        num_groups = base.kv.num_groups
        self.peak_blocks = [0] * num_groups
        self.decode_blocks = [0] * num_groups  # summed over (decoding request, step)
        self.decode_samples = 0

    def schedule(self) -> list[ScheduledSeq]:
        batch = super().schedule()
        null = self.kv.null_block_id
        held: list[set[int]] = [set() for _ in self.peak_blocks]
        for seq in self.running:
            request = seq.request
            tables = self.kv.get_block_ids(request.request_id)
            retained = self.kv.get_retained_block_ids(request.request_id)
            decoding = request.num_computed_tokens >= request.num_prompt_tokens
            self.decode_samples += decoding
            for g, (ids, kept) in enumerate(zip(tables, retained)):
                mine = {i for i in ids if i != null} | set(kept)
                held[g] |= mine
                if decoding:
                    self.decode_blocks[g] += len(mine)
        for g, group in enumerate(held):
            self.peak_blocks[g] = max(self.peak_blocks[g], len(group))
        return batch

    def group_usage(self, reusable_tokens: list[int]) -> list[GroupUsage]:
        samples = max(self.decode_samples, 1)
        return [GroupUsage(tokens, blocks / samples, peak) for tokens, blocks, peak
                in zip(reusable_tokens, self.decode_blocks, self.peak_blocks)]


@dataclass
class _Accounting:
    outputs: list[list[int]]
    hit_rate: float
    groups: list[GroupUsage]
    usage_trace: list[float]
    tokens_trace: list[int]


def _account(llm: LLM, workload: Workload) -> _Accounting:
    """One run with a metered scheduler; prefix-cache stats as differences."""
    stats = llm.kv.prefix_cache_stats
    hits, queries, group_hits = stats.hits, stats.queries, list(stats.group_hits)
    plain, metered = llm.scheduler, _MeteredScheduler(llm.scheduler)
    llm.scheduler = metered
    try:
        outputs, _ = run_once(llm, workload)
    finally:
        llm.scheduler = plain
    stats = llm.kv.prefix_cache_stats
    groups = metered.group_usage([now - before for now, before
                                  in zip(stats.group_hits, group_hits)])
    num_queries = stats.queries - queries
    return _Accounting(outputs, (stats.hits - hits) / num_queries if num_queries else 0.0,
                       groups, list(metered.stats.usage_trace), list(metered.stats.tokens_trace))


def _memory(llm: LLM, usage_trace: list[float], tokens_trace: list[int]) -> tuple[int, int]:
    """Most KV bytes held at once, and what all-full-attention layers need for the
    most tokens in flight at once."""
    cfg = llm.config
    block_bytes = cfg.page_size_bytes * cfg.num_tensors
    peak = round(max(usage_trace, default=0.0) * (cfg.num_blocks - 1))
    specs = list(llm.runner.kv_cache_specs(BLOCK_SIZE).values())
    attention = next(s for s in specs if isinstance(s, AttentionSpec))
    per_token = attention.page_size_bytes // attention.block_size
    return peak * block_bytes, per_token * len(specs) * max(tokens_trace, default=0)


def measure_ttft(engines: dict[bool, LLM], prefix_lengths: tuple[int, ...],
                 repeats: int) -> list[TTFTPoint]:
    """Per shared-prefix length: TTFT of a miss and of a hit with caching on, and of
    the same prompt with caching off. A warm-up round, then `repeats` rounds."""
    pairs = {n: shared_documents(num_docs=1, doc_len=n, questions_per_doc=2,
                                 question_len=QUESTION_LEN, seed=n) for n in prefix_lengths}
    points = {n: TTFTPoint(n, 0.0) for n in prefix_lengths}
    for round_index in range(repeats + 1):
        for n, (first, second) in pairs.items():
            point = points[n] if round_index else TTFTPoint(n, 0.0)  # round 0: warm-up
            _ttft_round(engines, first, second, point, off_first=round_index % 2 == 1)
    return list(points.values())


def _ttft_round(engines: dict[bool, LLM], first: list[int], second: list[int],
                point: TTFTPoint, off_first: bool) -> None:
    on, off = engines[True], engines[False]
    if off_first:
        point.off.values.append(_ttft(off, first)[0])
    if not on.kv.reset_prefix_cache():
        raise RuntimeError("the prefix cache could not be reset: a request still holds blocks")
    miss, cached = _ttft(on, first)
    if cached:
        raise RuntimeError(f"a first request reused {cached} tokens from an empty cache")
    hit, cached = _ttft(on, second)
    point.miss.values.append(miss)
    point.hit.values.append(hit)
    point.reused = cached / len(second)
    if not off_first:
        point.off.values.append(_ttft(off, first)[0])


def _ttft(llm: LLM, prompt: list[int]) -> tuple[float, int]:
    """(seconds to the first token as the engine measured it, tokens reused)."""
    out = llm.generate([prompt], TTFT_PARAMS)[0]
    assert out.metrics is not None, "a finished request carries its metrics"
    return out.metrics.time_to_first_token, out.num_cached_tokens
