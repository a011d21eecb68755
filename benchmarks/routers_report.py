"""Medians and ranges over repeated `bench_routers.py` runs.

    python benchmarks/routers_report.py --out DIR RUN_DIR [RUN_DIR ...]

Each RUN_DIR holds one `routers-MODEL-SETTING.json` (`routers-vllm-...` for vLLM
backends). Runs are grouped by (backend engine and model, setting); per router the
median and min-max over the runs of the hit rate, TTFT p50/p99, requests/s and request
imbalance, plus the errors summed, are printed as Markdown tables and written to
`DIR/routers-summary.json`, with one PNG per group (`DIR/routers-MODEL-SETTING.png`:
medians, bars from min to max). Target lines compare `hybridkv:hybrid-prefix` with the best peer
router (vllm-router, sglang-router).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import prepare_out, write_result  # noqa: E402

METRICS = [("hit_rate", "hit rate", 1.0, "{:.3f}"), ("ttft_p50_s", "TTFT p50 ms", 1e3, "{:.0f}"),
           ("ttft_p99_s", "TTFT p99 ms", 1e3, "{:.0f}"), ("requests_per_s", "req/s", 1.0,
                                                         "{:.2f}"),
           ("imbalance_requests", "imbalance req", 1.0, "{:.2f}")]
OURS = "hybridkv:hybrid-prefix"


def load_runs(dirs: list[str]) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for d in dirs:
        for path in glob.glob(os.path.join(d, "routers-*.json")):
            with open(path) as f:
                run = json.load(f)
            config = run["config"]
            engine = "vllm-" if config.get("backend_engine") == "vllm" else ""
            key = (engine + config["model"], config.get("setting", "light"))
            groups.setdefault(key, []).append(run)
    return groups


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Router -> metric -> {median, min, max}, plus errors, failures, runs."""
    out: dict[str, dict] = {}
    names = list(dict.fromkeys(n for run in runs for n in run["routers"]))
    for name in names:
        rows = [run["routers"][name] for run in runs if name in run["routers"]]
        ok = [r for r in rows if "failed" not in r]
        entry: dict = {"runs": len(ok), "failed": len(rows) - len(ok),
                       "errors": sum(r["errors"] for r in ok)}
        for key, *_ in METRICS:
            values = [r[key] for r in ok]
            if values:
                entry[key] = {"median": statistics.median(values), "min": min(values),
                              "max": max(values)}
        out[name] = entry
    return out


def table(summary: dict[str, dict]) -> str:
    head = "| router | " + " | ".join(title for _, title, *_ in METRICS) + " | errors |"
    lines = [head, "|" + " --- |" * (len(METRICS) + 2)]
    for name, entry in summary.items():
        cells = []
        for key, _, scale, fmt in METRICS:
            m = entry.get(key)
            cells.append("failed" if m is None else
                         f"{fmt.format(m['median'] * scale)} ({fmt.format(m['min'] * scale)}-"
                         f"{fmt.format(m['max'] * scale)})")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {entry['errors']} |")
    return "\n".join(lines)


def targets(summary: dict[str, dict]) -> dict:
    """hybrid-prefix against the best peer router: p99 TTFT ratio, hit-rate gap."""
    peers = {n: e for n, e in summary.items() if not n.startswith("hybridkv:") and
             "ttft_p99_s" in e}
    ours = summary.get(OURS)
    if not peers or not ours or "ttft_p99_s" not in ours:
        return {}
    best_p99 = min(e["ttft_p99_s"]["median"] for e in peers.values())
    best_hit = max(e["hit_rate"]["median"] for e in peers.values())
    return {"p99_ratio_to_best_peer": ours["ttft_p99_s"]["median"] / best_p99,
            "p50_ratio_to_best_peer": ours["ttft_p50_s"]["median"] /
            min(e["ttft_p50_s"]["median"] for e in peers.values()),
            "hit_rate_minus_best_peer": ours["hit_rate"]["median"] - best_hit}


def plot(summary: dict[str, dict], title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, e in summary.items() if "hit_rate" in e]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 4.5))
    for ax, (key, label, scale, _) in zip(axes, METRICS):
        med = [summary[n][key]["median"] * scale for n in names]
        low = [m - summary[n][key]["min"] * scale for n, m in zip(names, med)]
        high = [summary[n][key]["max"] * scale - m for n, m in zip(names, med)]
        colors = ["tab:orange" if n == OURS else "tab:blue" for n in names]
        ax.bar(range(len(names)), med, yerr=[low, high], color=colors, capsize=3)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(label, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    args = ap.parse_args(argv)
    out = prepare_out(args.out)
    report = {}
    for (model, setting), runs in sorted(load_runs(args.runs).items()):
        summary = summarize(runs)
        loads = [run["load_average"][0] for run in runs]
        report[f"{model}-{setting}"] = {"runs": len(runs), "load_average_1min": loads,
                                        "routers": summary, "targets": targets(summary)}
        print(f"\n**{model}, {setting}** ({len(runs)} runs, load average "
              f"{min(loads):.1f}-{max(loads):.1f})\n\n{table(summary)}\n")
        print(json.dumps(report[f"{model}-{setting}"]["targets"]))
        plot(summary, f"{model}, {setting}: median of {len(runs)} runs (bars: min-max)",
             os.path.join(out, f"routers-{model}-{setting}.png"))
    print(write_result("routers-summary", report, out))
    return report


if __name__ == "__main__":
    main()
