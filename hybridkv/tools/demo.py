"""`hybridkv demo`: hybrid models served with prefix caching, measured on this machine.

For the built-in Gemma-3-style and Jamba-style tiny presets (random weights,
CPU) it runs three workloads — shared documents (RAG), multi-turn chat and
few-shot prompts — with prefix caching on and off, and prints per model:
prefix hit rate per KV cache group, time to first token on a miss and on a
hit, requests/s with caching on and off, peak KV memory against what an
all-full-attention cache would need, and whether the outputs were identical.
It writes PNG plots into an output folder. Every number comes from the run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from hybridkv.engine.llm import LLM
from hybridkv.engine.sampling import SamplingParams
from hybridkv.kv_cache.specs import AttentionSpec
from hybridkv.models.presets import build_preset_model
from hybridkv.tools.workloads import ChatWorkload, few_shot, shared_documents

DEMO_PRESETS = ("gemma3-tiny", "jamba-tiny")
OUTPUT_LEN = 12


@dataclass
class WorkloadResult:
    name: str
    requests: int
    seconds_on: float
    seconds_off: float
    identical: bool
    group_hit_rates: list[float]
    hit_rate: float
    usage_trace: list[float] = field(default_factory=list)
    peak_bytes: int = 0
    full_attention_bytes: int = 0


def _engine(model, caching: bool) -> LLM:
    return LLM(model, enable_prefix_caching=caching, block_size=16, num_blocks=2048,
               max_num_batched_tokens=2048)


def _run(model, name: str, caching: bool) -> tuple[list[list[int]], float, LLM]:
    llm = _engine(model, caching)
    params = SamplingParams(max_tokens=OUTPUT_LEN, ignore_eos=True)

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        return [o.output_token_ids for o in llm.generate(prompts, params)]

    t0 = time.perf_counter()
    if name == "multi-turn chat":
        outputs = ChatWorkload(num_sessions=4, num_turns=4, system_len=256, user_len=64).run(
            generate)
    elif name == "shared documents":
        outputs = generate(shared_documents(num_docs=4, doc_len=1024, questions_per_doc=6))
    else:
        outputs = generate(few_shot(header_len=1024, num_questions=16))
    return outputs, time.perf_counter() - t0, llm


def run_workload(model, name: str) -> WorkloadResult:
    """One workload with caching on and off: speed, hit rates, memory, identity."""
    out_on, t_on, llm = _run(model, name, True)
    out_off, t_off, _ = _run(model, name, False)
    stats = llm.kv.prefix_cache_stats
    groups = len(llm.config.kv_cache_groups)
    result = WorkloadResult(name, len(out_on), t_on, t_off, out_on == out_off,
                            [stats.group_hit_rate(g) for g in range(groups)], stats.hit_rate,
                            list(llm.scheduler.stats.usage_trace))
    result.peak_bytes, result.full_attention_bytes = _memory(llm)
    return result


def _memory(llm: LLM) -> tuple[int, int]:
    """Peak KV bytes held, and what an all-full-attention cache needs for the same tokens."""
    cfg = llm.config
    block_bytes = cfg.page_size_bytes * cfg.num_tensors
    peak = max(llm.scheduler.stats.usage_trace, default=0.0) * (cfg.num_blocks - 1)
    specs = llm.runner.kv_cache_specs(16).values()
    attn = [s for s in specs if isinstance(s, AttentionSpec)]
    per_token = attn[0].page_size_bytes // attn[0].block_size
    full_bytes = per_token * len(specs) * max(llm.scheduler.stats.tokens_trace, default=0)
    return int(peak * block_bytes), full_bytes


def measure_ttft(model, prefix_len: int, question_len: int = 24) -> tuple[float, float, float]:
    """(TTFT miss, TTFT hit, fraction of the hit prompt reused) for one shared prefix."""
    docs = shared_documents(num_docs=1, doc_len=prefix_len, questions_per_doc=3,
                            question_len=question_len, seed=prefix_len)
    llm = _engine(model, True)
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    llm.generate([docs[2][:question_len]], one)  # warm-up
    t0 = time.perf_counter()
    llm.generate([docs[0]], one)
    miss = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = llm.generate([docs[1]], one)[0]
    hit = time.perf_counter() - t0
    return miss, hit, out.num_cached_tokens / len(docs[1])


def format_table(preset: str, results: list[WorkloadResult], ttft: tuple[float, float, float],
                 group_names: list[str]) -> str:
    lines = [f"== {preset}: groups {', '.join(group_names)}",
             f"   TTFT on a 1,024-token shared document: miss {ttft[0] * 1e3:.1f} ms, "
             f"hit {ttft[1] * 1e3:.1f} ms ({ttft[2]:.0%} of the prompt reused)",
             f"   {'workload':18s} {'hit rate':>8s} {'per group':>18s} {'req/s on':>9s} "
             f"{'req/s off':>9s} {'KV MiB':>7s} {'all-full MiB':>12s}"]
    for r in results:
        per_group = "/".join(f"{h:.2f}" for h in r.group_hit_rates)
        lines.append(f"   {r.name:18s} {r.hit_rate:8.3f} {per_group:>18s} "
                     f"{r.requests / r.seconds_on:9.1f} {r.requests / r.seconds_off:9.1f} "
                     f"{r.peak_bytes / 2**20:7.2f} {r.full_attention_bytes / 2**20:12.2f}")
    same = all(r.identical for r in results)
    lines.append("   outputs with caching off: " + ("identical" if same else "DIFFERENT"))
    return "\n".join(lines)


def run_demo(out_dir: str = "hybridkv-demo-output", presets: tuple[str, ...] = DEMO_PRESETS,
             prefix_lengths: tuple[int, ...] = (64, 128, 256, 512, 1024),
             show_progress: bool = True) -> int:
    """Run the demo; print the tables, write the plots; return 0 if outputs matched."""
    workloads = ("shared documents", "multi-turn chat", "few-shot prompts")
    steps = len(presets) * (len(workloads) + 1) + len(prefix_lengths)
    progress = _progress(steps, show_progress)
    tables, usage, sweep, all_same = [], {}, [], True
    for preset in presets:
        model = build_preset_model(preset, seed=0)
        _engine(model, True).generate([[5] * 64], SamplingParams(max_tokens=2))  # warm-up
        results = []
        for name in workloads:
            results.append(run_workload(model, name))
            progress(f"{preset}: {name}")
        ttft = measure_ttft(model, 1024)
        progress(f"{preset}: time to first token")
        groups = [type(g.kv_cache_spec).__name__.replace("Spec", "")
                  for g in _engine(model, True).config.kv_cache_groups]
        tables.append(format_table(preset, results, ttft, groups))
        usage[preset] = results[0].usage_trace
        all_same = all_same and all(r.identical for r in results)
    model = build_preset_model(presets[0], seed=0)
    for n in prefix_lengths:
        sweep.append((n, *measure_ttft(model, n)))
        progress(f"{presets[0]}: shared prefix of {n} tokens")
    print("\n" + "\n\n".join(tables))
    paths = write_plots(out_dir, presets[0], sweep, usage)
    print("\nplots: " + ", ".join(paths))
    return 0 if all_same else 1


def write_plots(out_dir: str, preset: str, sweep: list[tuple[int, float, float, float]],
                usage: dict[str, list[float]]) -> list[str]:
    """Hit rate and TTFT against shared-prefix length; pool usage over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    lengths = [s[0] for s in sweep]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].plot(lengths, [s[3] for s in sweep], marker="o")
    ax[0].set(xlabel="shared prefix (tokens)", ylabel="fraction of prompt reused",
              title=f"{preset}: prefix hit rate", xscale="log")
    ax[1].plot(lengths, [s[1] * 1e3 for s in sweep], marker="o", label="miss")
    ax[1].plot(lengths, [s[2] * 1e3 for s in sweep], marker="o", label="hit")
    ax[1].set(xlabel="shared prefix (tokens)", ylabel="ms", title="time to first token",
              xscale="log")
    ax[1].legend()
    first = os.path.join(out_dir, "hit_rate_and_ttft.png")
    fig.tight_layout()
    fig.savefig(first, dpi=100)
    plt.close(fig)
    fig, axis = plt.subplots(figsize=(6, 4))
    for name, trace in usage.items():
        axis.plot(range(len(trace)), [u * 100 for u in trace], label=name)
    axis.set(xlabel="scheduler step", ylabel="pool usage (%)",
             title="KV pool usage, shared documents")
    axis.legend()
    second = os.path.join(out_dir, "pool_usage.png")
    fig.tight_layout()
    fig.savefig(second, dpi=100)
    plt.close(fig)
    return [first, second]


def _progress(total: int, enabled: bool):
    """A callable advancing a progress bar by one step with a description."""
    bar = None
    if enabled:
        try:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, desc="hybridkv demo", unit="step")
        except ImportError:
            bar = None

    def advance(label: str) -> None:
        if bar is not None:
            bar.set_postfix_str(label)
            bar.update(1)
            if bar.n >= total:
                bar.close()
        elif enabled:
            print(f"... {label}", flush=True)

    return advance
