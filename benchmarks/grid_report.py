"""Summaries of a policy grid (bench_policy_grid.py): per config kind and per shape.

A cell is (shape, block size, pool fraction, config kind, window); its
fraction of the ideal is the mean hit rate over its seeds divided by the
mean clairvoyant hit rate over the same seeds (1.0 when both are 0).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

TARGET_MEAN, TARGET_WORST, LRU_SLACK = 0.9, 0.75, 0.01
# the orders every other policy is held to (within LRU_SLACK, cell by cell)
BASELINES = ("lru", "vllm-dense", "vllm-sparse")


def cell_name(key: tuple) -> str:
    shape, bs, frac, kind, window = key
    w = f" w{window}" if kind == "swa" else ""
    return f"{shape} B{bs} @{round(frac * 100)}% {kind}{w}"


def cells(rows: list[dict[str, Any]], policies: list[str]) -> dict[tuple, dict[str, Any]]:
    """Per cell: seeds, mean hit per policy and of the ideal, and fractions of the ideal."""
    grouped: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        grouped[(r["shape"], r["block_size"], r["frac"], r["kind"], r["window"])].append(r)
    out = {}
    for key, rs in sorted(grouped.items()):
        ideal = statistics.mean(r["ideal"]["hit"] for r in rs)
        cell: dict[str, Any] = {"seeds": len(rs), "ideal": round(ideal, 5)}
        for p in policies:
            mean = statistics.mean(r[p]["hit"] for r in rs)
            cell[p] = round(mean, 5)
            cell[p + "/ideal"] = round(mean / ideal, 4) if ideal > 0 else 1.0
        out[key] = cell
    return out


def against_baselines(mine: dict[tuple, dict[str, Any]], p: str,
                      policies: list[str]) -> dict[str, Any]:
    """Worst cell against `lru` and, per baseline run, the cells below it - LRU_SLACK."""
    entry: dict[str, Any] = {}
    for base in (b for b in BASELINES if b in policies):
        deltas = {k: c[p] - c[base] for k, c in mine.items()}
        low = min(deltas, key=deltas.__getitem__)
        if base == "lru":
            entry["vs_lru_worst"] = round(deltas[low], 4)
            entry["vs_lru_worst_cell"] = cell_name(low)
        entry["below_" + base] = sum(d < -LRU_SLACK for d in deltas.values())
    return entry


def summarize(rows: list[dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    """Per config kind and policy: mean fraction of the ideal, worst cell, and the
    cells where the policy trails `lru` by more than LRU_SLACK."""
    table = cells(rows, policies)
    summary: dict[str, Any] = {"kinds": {}, "shapes": {}}
    kinds = sorted({k[3] for k in table}, key=["full", "swa", "mamba"].index)
    for kind in kinds:
        mine = {k: c for k, c in table.items() if k[3] == kind}
        per_policy = {}
        for p in policies:
            fracs = {k: c[p + "/ideal"] for k, c in mine.items()}
            worst = min(fracs, key=fracs.__getitem__)
            entry = {"cells": len(fracs), "mean": round(statistics.mean(fracs.values()), 4),
                     "worst": fracs[worst], "worst_cell": cell_name(worst),
                     "below_0.75": sum(v < TARGET_WORST for v in fracs.values())}
            if p not in BASELINES:
                entry.update(against_baselines(mine, p, policies))
            per_policy[p] = entry
        summary["kinds"][kind] = per_policy
        for shape in sorted({k[0] for k in mine}):
            summary["shapes"][f"{kind}/{shape}"] = {
                p: round(statistics.mean(c[p + "/ideal"] for k, c in mine.items()
                                         if k[0] == shape), 4) for p in policies}
    summary["cells"] = {cell_name(k): c for k, c in table.items()}
    return summary


def below(entry: dict[str, Any]) -> str:
    return " / ".join(str(entry.get("below_" + b, "-")) for b in BASELINES)


def write_markdown(summary: dict[str, Any], policies: list[str]) -> str:
    """The per-kind table and the per-shape table, as Markdown."""
    lines = ["| config | policy | cells | mean / ideal | worst cell | cells < 0.75 "
             "| worst vs lru | cells below lru / vllm-dense / vllm-sparse - 0.01 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, per_policy in summary["kinds"].items():
        for p in policies:
            e = per_policy[p]
            vs = (f"{e['vs_lru_worst']:+.4f} ({e['vs_lru_worst_cell']})"
                  if "vs_lru_worst" in e else "-")
            lines.append(f"| {kind} | {p} | {e['cells']} | {e['mean']:.3f} | {e['worst']:.3f} "
                         f"({e['worst_cell']}) | {e['below_0.75']} | {vs} "
                         f"| {below(e)} |")
    lines += ["", "| config/shape | " + " | ".join(policies) + " |",
              "| --- | " + " | ".join("---" for _ in policies) + " |"]
    for name, per_policy in summary["shapes"].items():
        lines.append(f"| {name} | " + " | ".join(f"{per_policy[p]:.3f}" for p in policies) + " |")
    return "\n".join(lines)
