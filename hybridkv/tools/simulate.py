"""`hybridkv simulate`: capacity planning without running a model.

Replays a trace through the real KVCacheManager and the engine's scheduler
(continuous batching, chunked prefill, preemption), with generated tokens
drawn from a fixed-seed stream instead of a model. Reports the hit rate,
how many tokens the pool holds, blocks per group, evictions and
preemptions, for the model's real layer layout and a KV memory budget, and
plots hit rate against budget.

`max_num_seqs` N bounds the requests in flight: the rest wait and are
admitted in trace order as others finish, as on a server driven by N
concurrent clients. `passes` K replays the trace K times in a row (one
queue), as a benchmark that cycles through its prompts does.
"""

from __future__ import annotations

import json
import os
import random
import warnings
from dataclasses import dataclass, field

from hybridkv.engine.sampling import SamplingParams
from hybridkv.engine.scheduler import Scheduler, SeqState
from hybridkv.kv_cache.checks import check_int, format_bytes, parse_bytes
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.tools.workloads import BUILTIN_TRACES, ChatWorkload, few_shot, shared_documents


def parse_sweep(text: str) -> list[float]:
    """'0.25,0.5,1,2' -> budget multipliers; ValueError naming --sweep and the bad item."""
    items = [f.strip() for f in str(text).split(",")]
    factors = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise ValueError(f"--sweep {text!r}: {item!r} is not a positive budget multiplier "
                             f"(use a list like 0.25,0.5,1,2)")
        factors.append(value)
    return factors


@dataclass
class TraceRequest:
    prompt: list[int]
    max_tokens: int


def load_trace(spec: str, vocab: int = 32000) -> list[TraceRequest] | ChatWorkload:
    """A JSONL file (one {"prompt": [ids], "max_tokens": n} per line) or a built-in name."""
    if spec == "shared-documents":
        prompts = shared_documents(num_docs=4, doc_len=4096, questions_per_doc=16,
                                   question_len=64, vocab=vocab)
        return [TraceRequest(p, 64) for p in prompts]
    if spec == "few-shot":
        return [TraceRequest(p, 64) for p in few_shot(2048, 64, 96, vocab=vocab)]
    if spec == "multi-turn":
        return ChatWorkload(num_sessions=16, num_turns=5, system_len=512, user_len=256,
                            vocab=vocab)
    if not os.path.isfile(spec):
        raise FileNotFoundError(f"trace {spec!r} is neither a file nor a built-in trace "
                                f"({', '.join(BUILTIN_TRACES)})")
    return _read_jsonl(spec)


def _read_jsonl(path: str) -> list[TraceRequest]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt = row.get("prompt", row.get("prompt_token_ids"))
                max_tokens = row.get("max_tokens", 16)
                Request("check", prompt)  # validates the token ids
                SamplingParams(max_tokens=max_tokens)
            except (json.JSONDecodeError, AttributeError, ValueError, TypeError) as e:
                raise ValueError(f"{path}:{n}: malformed trace line ({e}); expected "
                                 f'{{"prompt": [token ids], "max_tokens": n}}') from e
            out.append(TraceRequest(list(prompt), max_tokens))
    if not out:
        raise ValueError(f"{path}: the trace is empty")
    return out


@dataclass
class SimResult:
    budget_bytes: int
    num_blocks: int
    hit_rate: float
    requests: int
    preemptions: int
    evictions: int
    peak_tokens: int
    group_hit_rates: list[float]
    group_blocks_peak: list[int]
    notes: list[str] = field(default_factory=list)  # the manager's warnings, once each


class Simulator:
    """The scheduler and manager of the engine, with tokens from a seeded stream."""

    def __init__(self, config: KVCacheConfig, *, eviction_policy: str | None = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 8192, seed: int = 0):
        kwargs = {"eviction_policy": eviction_policy} if eviction_policy else {}
        self.kv = KVCacheManager(config, **kwargs)
        self.scheduler = Scheduler(self.kv, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens)
        self.rng = random.Random(seed)
        self.count = 0
        self.group_peak = [0] * len(config.kv_cache_groups)

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        seqs = []
        for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
            if not self.kv.can_fit(len(prompt) + n, self.scheduler.max_num_batched_tokens):
                raise ValueError(f"request {i} ({len(prompt)} tokens) needs more blocks than "
                                 f"the whole pool has ({self.kv.pool.num_blocks}); raise --memory")
            self.count += 1
            seqs.append(SeqState(Request(f"sim-{self.count}", prompt), SamplingParams(n), i))
            self.scheduler.add(seqs[-1])
        while self.scheduler.has_work():
            self._step()
        return [s.request.output_token_ids for s in seqs]

    def _step(self) -> None:
        batch = self.scheduler.schedule()
        self.scheduler.finish_step(batch)
        self._record_group_blocks()
        for item in batch:
            if item.samples:
                seq = item.seq
                seq.request.append_output_token_ids(self.rng.randrange(3, 32000))
                if seq.num_output_tokens >= seq.params.max_tokens:
                    self.scheduler.finish(seq, "length")

    def _record_group_blocks(self) -> None:
        null = self.kv.null_block_id
        for g, manager in enumerate(self.kv.coordinator.managers):
            held = sum(1 for blocks in manager.req_to_blocks.values() for b in blocks
                       if b.block_id != null)
            self.group_peak[g] = max(self.group_peak[g], held)


def simulate(layout: dict, budget: int, trace, *, passes: int = 1, **kwargs) -> SimResult:
    """Replay `trace` `passes` times on a pool sized from `budget` for the model `layout`.

    `kwargs` go to `Simulator` (`max_num_seqs`: requests in flight). The
    manager's RuntimeWarnings (e.g. repeated misses of a pool too small for
    the working set) are part of the result (`notes`), not printed.
    ValueError when `passes` is not a positive integer.
    """
    check_int("passes", passes, 1)
    config = KVCacheConfig.from_layer_specs(layout, budget)
    sim = Simulator(config, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        if isinstance(trace, ChatWorkload):
            for _ in range(passes):  # each pass replays the same conversations from the start
                trace.run(lambda prompts: sim.generate(prompts, [64] * len(prompts)))
        else:
            sim.generate([t.prompt for t in trace] * passes, [t.max_tokens for t in trace] * passes)
    stats = sim.kv.prefix_cache_stats
    notes = list(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))
    return SimResult(budget, config.num_blocks, stats.hit_rate, sim.count,
                     sim.scheduler.stats.preemptions, stats.evictions,
                     max(sim.scheduler.stats.tokens_trace, default=0),
                     [stats.group_hit_rate(g) for g in range(len(stats.group_hits))],
                     sim.group_peak, notes)


def run_simulate(args) -> int:
    """The `hybridkv simulate` command."""
    from hybridkv.models.layouts import model_layout

    budget = parse_bytes(args.memory)
    factors = parse_sweep(args.sweep)
    layout = model_layout(args.model, args.block_size)
    trace = load_trace(args.trace)
    options = {"eviction_policy": args.eviction_policy, "passes": args.passes,
               "max_num_seqs": args.max_num_seqs}
    main = simulate(layout, budget, trace, **options)
    print(_report(args, layout, main))
    results = [main]
    for factor in sorted(set(factors) - {1.0}):
        try:
            trace = load_trace(args.trace) if isinstance(trace, ChatWorkload) else trace
            results.append(simulate(layout, int(budget * factor), trace, **options))
        except ValueError as e:  # a budget in the sweep too small for the trace
            print(f"  sweep x{factor:g}: {str(e).splitlines()[0]}")
            continue
        r = results[-1]
        print(f"  sweep x{factor:g}: {format_bytes(r.budget_bytes)}, {r.num_blocks:,} blocks, "
              f"hit rate {r.hit_rate:.3f}, evictions {r.evictions:,}, "
              f"preemptions {r.preemptions}")
        print(*(f"    note: {n}" for n in r.notes), sep="\n", end="\n" if r.notes else "")
    results.sort(key=lambda r: r.budget_bytes)
    path = _plot(args.out, args.model, results)
    print(f"plot: {path}")
    return 0


def _report(args, layout: dict, r: SimResult) -> str:
    config = KVCacheConfig.from_layer_specs(layout, r.budget_bytes)
    lines = [f"{args.model}: {len(layout)} layers, trace {args.trace} x{args.passes}, "
             f"at most {args.max_num_seqs} in flight, budget {format_bytes(r.budget_bytes)}",
             *("  " + ln for ln in config.describe().splitlines()),
             f"  requests {r.requests}, prefix hit rate {r.hit_rate:.3f} "
             f"(per group {', '.join(f'{h:.3f}' for h in r.group_hit_rates)})",
             f"  peak tokens scheduled {r.peak_tokens:,}, peak blocks per group "
             f"{r.group_blocks_peak}, evictions {r.evictions:,}, preemptions {r.preemptions}",
             *(f"  note: {n}" for n in r.notes)]
    return "\n".join(lines)


def _plot(out_dir: str, model: str, results: list[SimResult]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r.budget_bytes / 2**30 for r in results], [r.hit_rate for r in results],
            marker="o")
    ax.set(xlabel="KV cache budget (GiB)", ylabel="prefix hit rate", title=model, ylim=(0, 1))
    path = os.path.join(out_dir, "hit_rate_vs_budget.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
