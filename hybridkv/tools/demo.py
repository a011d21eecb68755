"""`hybridkv demo`: hybrid models served with prefix caching, measured on this machine.

For the built-in Gemma-3-style and Jamba-style tiny presets (random weights,
CPU) it runs three workloads — shared documents (RAG), multi-turn chat and
few-shot prompts — with prefix caching on and off, and prints per model:
time to first token on a miss, on a hit and with caching off; requests/s with
caching on and off; the prefix hit rate; what each KV cache group reused,
held and kept; peak KV memory against what an all-full-attention cache would
need; and whether the outputs were identical. It writes PNG plots drawn from
the same measurements. How the figures are taken: `hybridkv.tools.demo_measure`.
"""

from __future__ import annotations

import os
import time
import warnings

import torch

from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from hybridkv.models.presets import build_preset_model, get_preset
from hybridkv.tools.cli import check_output_dir
from hybridkv.tools.demo_measure import (
    Samples,
    TTFTPoint,
    WorkloadResult,
    demo_workloads,
    make_engines,
    measure_ttft,
    measure_workload,
)
from hybridkv.tools.demo_plots import write_plots

DEMO_PRESETS = ("gemma3-tiny", "jamba-tiny")
PREFIX_LENGTHS = (64, 128, 256, 512, 1024)
REPEATS = 5


def run_demo(out_dir: str = "hybridkv-demo-output", presets: tuple[str, ...] = DEMO_PRESETS,
             prefix_lengths: tuple[int, ...] = PREFIX_LENGTHS, show_progress: bool = True,
             repeats: int = REPEATS, num_threads: int = 1) -> int:
    """Run the demo; print the tables, write the plots; return 0 if outputs matched.

    `repeats` timed runs per figure follow a warm-up run; torch runs on
    `num_threads` threads meanwhile (restored after). ValueError, before
    anything runs, for an unknown preset, an unwritable `out_dir` or bad counts.
    """
    _check_arguments(out_dir, presets, prefix_lengths, repeats, num_threads)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        with warnings.catch_warnings():
            # every run starts from an emptied cache, so its first lookups miss again
            warnings.filterwarnings("ignore", message="prefix caching: a prompt prefix",
                                    category=RuntimeWarning)
            return _run(out_dir, presets, tuple(sorted(prefix_lengths)), show_progress,
                        repeats, num_threads)
    finally:
        torch.set_num_threads(previous_threads)


def _run(out_dir: str, presets: tuple[str, ...], prefix_lengths: tuple[int, ...],
         show_progress: bool, repeats: int, num_threads: int) -> int:
    workloads = demo_workloads()
    progress = _progress(len(presets) * (len(workloads) + 1), show_progress)
    start, load = time.perf_counter(), os.getloadavg()[0]
    tables, usage, sweeps, all_same = [], {}, {}, True
    for preset in presets:
        engines = make_engines(build_preset_model(preset, seed=0))
        results = []
        for name, workload in workloads.items():
            results.append(measure_workload(engines, name, workload, repeats))
            progress(f"{preset}: {name}")
        sweeps[preset] = measure_ttft(engines, prefix_lengths, repeats)
        progress(f"{preset}: time to first token")
        specs = [g.kv_cache_spec for g in engines[True].config.kv_cache_groups]
        tables.append(format_table(preset, results, sweeps[preset][-1], specs,
                                   engines[True].config.num_blocks - 1))
        usage[preset] = results[0].usage_trace
        all_same = all_same and all(r.identical for r in results)
    print(f"\nhybridkv demo: torch on {num_threads} thread(s); each figure is the median of "
          f"{repeats} timed run(s) after a warm-up run, [min-max] in brackets, caching on "
          f"and off alternating\n(load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end; {time.perf_counter() - start:.0f} s)")
    print("\n" + "\n\n".join(tables))
    paths = write_plots(out_dir, sweeps, usage)
    print("\nplots: " + ", ".join(paths))
    return 0 if all_same else 1


def _check_arguments(out_dir: str, presets: tuple[str, ...], prefix_lengths: tuple[int, ...],
                     repeats: int, num_threads: int) -> None:
    if not presets:
        raise ValueError("no preset to run")
    for preset in presets:
        get_preset(preset)
    for name, value in (("repeats", repeats), ("num_threads", num_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not prefix_lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                 for n in prefix_lengths):
        raise ValueError(f"prefix_lengths must be ints >= 1, got {prefix_lengths!r}")
    check_output_dir(out_dir)


def format_table(preset: str, results: list[WorkloadResult], ttft: TTFTPoint,
                 specs: list[KVCacheSpec], num_blocks: int) -> str:
    """One model's figures: TTFT, speed, memory, identity, then what each group did."""
    lines = [f"== {preset}: {len(specs)} KV cache groups sharing a pool of {num_blocks:,} "
             f"blocks",
             f"   time to first token, {ttft.prefix_len:,}-token shared document + question: "
             f"caching off {_ms(ttft.off)}",
             f"   caching on: miss {_ms(ttft.miss)}, hit {_ms(ttft.hit)} "
             f"({ttft.reused:.0%} of the prompt reused)",
             f"   {'workload':17s} {'hit rate':>8s} {'req/s on':>21s} {'req/s off':>21s} "
             f"{'on/off':>6s} {'KV MiB':>7s} {'all-full MiB':>12s}"]
    for r in results:
        lines.append(f"   {r.name:17s} {r.hit_rate:8.3f} {_rate(r.rate_on):>21s} "
                     f"{_rate(r.rate_off):>21s} {r.speedup:5.1f}x "
                     f"{r.peak_bytes / 2**20:7.2f} {r.full_attention_bytes / 2**20:12.2f}")
    same = all(r.identical for r in results)
    lines.append("   outputs with caching off: " + ("identical (every run)" if same
                                                    else "DIFFERENT"))
    return "\n".join(lines + _group_lines(results, specs))


def _group_lines(results: list[WorkloadResult], specs: list[KVCacheSpec]) -> list[str]:
    """Per group (equal groups merged), for each workload: tokens it alone could
    reuse / blocks a decoding request held / most blocks held at once."""
    show_block = len({s.block_size for s in specs}) > 1
    rows: dict[tuple, list[int]] = {}
    for g, spec in enumerate(specs):
        cells = tuple(f"{r.groups[g].reusable_tokens:,} / {r.groups[g].blocks_per_request:.1f}"
                      f" / {r.groups[g].peak_blocks}" for r in results)
        rows.setdefault((describe_spec(spec, show_block), cells), []).append(g)
    lines = ["   per KV cache group (first run of each workload): tokens it alone could reuse / "
             "blocks a decoding request holds (mean) / most blocks held at once",
             f"   {'groups':28s} " + " ".join(f"{r.name:>22s}" for r in results)]
    for (label, cells), ids in rows.items():
        name = f"{_id_range(ids)} {label}"
        lines.append(f"   {name:28s} " + " ".join(f"{c:>22s}" for c in cells))
    return lines


def describe_spec(spec: KVCacheSpec, show_block_size: bool = False) -> str:
    """A short name of a group's attention type, e.g. "sliding window 32"."""
    if isinstance(spec, SlidingWindowSpec):
        label = f"sliding window {spec.sliding_window}"
        if spec.num_sink_tokens:
            label += f" + {spec.num_sink_tokens} sinks"
    elif isinstance(spec, ChunkedLocalAttentionSpec):
        label = f"chunked local {spec.attention_chunk_size}"
    elif isinstance(spec, MambaSpec):
        label = "Mamba state"
    elif isinstance(spec, FullAttentionSpec):
        label = "full attention"
    else:
        label = type(spec).__name__.removesuffix("Spec")
    return f"{label} (block {spec.block_size})" if show_block_size else label


def _id_range(ids: list[int]) -> str:
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def _ms(samples: Samples) -> str:
    return (f"{samples.median * 1e3:.1f} ms [{samples.low * 1e3:.1f}-"
            f"{samples.high * 1e3:.1f}]")


def _rate(samples: Samples) -> str:
    return f"{samples.median:.1f} [{samples.low:.1f}-{samples.high:.1f}]"


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
