"""The demo's PNG plots, drawn from the same measurements as its tables."""

from __future__ import annotations

import os

from hybridkv.tools.demo_measure import Samples, TTFTPoint


def write_plots(out_dir: str, sweeps: dict[str, list[TTFTPoint]],
                usage: dict[str, list[float]]) -> list[str]:
    """`hit_rate_and_ttft.png` (reuse and TTFT against shared-prefix length, per
    model) and `pool_usage.png` (pool usage per step, shared documents)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    first = os.path.join(out_dir, "hit_rate_and_ttft.png")
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    lengths: list[int] = []
    for index, (preset, points) in enumerate(sweeps.items()):
        color = f"C{index}"
        lengths = [p.prefix_len for p in points]
        ax[0].plot(lengths, [p.reused for p in points], marker="o", color=color, label=preset)
        for label, style, marker, pick in (("miss", "-", "o", _miss), ("hit", "--", "s", _hit),
                                           ("caching off", ":", "^", _off)):
            samples = [pick(p) for p in points]
            ax[1].errorbar(lengths, [s.median * 1e3 for s in samples],
                           yerr=_error_bars(samples), linestyle=style, marker=marker,
                           color=color, capsize=3, label=f"{preset} {label}")
    ax[0].set(xlabel="shared prefix (tokens)", ylabel="fraction of the prompt reused",
              title="second question on a shared prefix", xscale="log", ylim=(0, 1))
    ax[0].legend()
    ax[1].set(xlabel="shared prefix (tokens)", ylabel="ms (median, bars: min-max)",
              title="time to first token", xscale="log", yscale="log")
    ax[1].legend(fontsize=7)
    for axis in ax:
        axis.set_xticks(lengths, [str(n) for n in lengths])
        axis.minorticks_off()
    fig.tight_layout()
    fig.savefig(first, dpi=100)
    plt.close(fig)
    second = os.path.join(out_dir, "pool_usage.png")
    fig, axis = plt.subplots(figsize=(6, 4))
    for name, trace in usage.items():
        axis.plot(range(len(trace)), [u * 100 for u in trace], label=name)
    axis.set(xlabel="scheduler step", ylabel="pool usage (%)",
             title="KV pool usage, shared documents (caching on)")
    axis.legend()
    fig.tight_layout()
    fig.savefig(second, dpi=100)
    plt.close(fig)
    return [first, second]


def _miss(point: TTFTPoint) -> Samples:
    return point.miss


def _hit(point: TTFTPoint) -> Samples:
    return point.hit


def _off(point: TTFTPoint) -> Samples:
    return point.off


def _error_bars(samples: list[Samples]) -> list[list[float]]:
    # [[below the median], [above]] in ms, per point
    return [[(s.median - s.low) * 1e3 for s in samples],
            [(s.high - s.median) * 1e3 for s in samples]]
