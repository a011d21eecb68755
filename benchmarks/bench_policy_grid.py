"""Eviction policies on a grid of pressure workloads, against a clairvoyant ideal.

Every cell is a workload shape, a block size, a pool fraction and a config
(full attention; full + sliding window of each window size; full + Mamba),
replayed for several trace seeds through the real KVCacheManager by a
continuous-batching driver (hybridkv.tools.replay), once per eviction
policy, and through the clairvoyant cache (hybridkv.tools.ideal, best of
a few fallback spacings) on the same pool and driver. A pool fraction is a
share of the trace's reusable full-attention working set; a config with two
groups gets twice the blocks (the same bytes), and never fewer than the
longest request needs alone.

Per config kind it reports the mean fraction of the ideal over cells (a
cell's fraction: its seeds' mean hit rate over their mean ideal), the worst
cell, and each cell against `lru`.

    python benchmarks/bench_policy_grid.py [--quick] [--out DIR] [--workers 2]
        [--policies lru,hybrid] [--seeds 0-5] [--plugin FILE]

Ideal hit rates are cached in DIR (they depend on the trace and pool only),
so rerunning with another policy replays only the policy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from typing import Any

from grid_report import summarize, write_markdown
from grid_shapes import VLLM_SHAPES, grid_trace, with_concurrency
from vllm_policies import manager_settings

from hybridkv import KVCacheManager
from hybridkv.tools.ideal import ClairvoyantCache, PrefixIndex, reusable_blocks, reuse_ceiling
from hybridkv.tools.pressure_workloads import WORKLOADS
from hybridkv.tools.replay import ManagerAdapter, make_config, replay

TOKEN_BUDGET = 8192
FULL_GRID = dict(shapes=list(WORKLOADS) + list(VLLM_SHAPES), seeds=list(range(3)),
                 block_sizes=[16, 64, 128], fracs=[0.3, 0.5, 0.7], windows=[512, 1024, 4096],
                 kinds=["full", "swa", "mamba"], concurrency=[1, 2, 4, 8])
QUICK_GRID = dict(FULL_GRID, seeds=[0, 1, 2], block_sizes=[16, 128], windows=[512])


def pool_blocks(kind: str, frac: float, reusable: int, longest: int, block_size: int,
                window: int) -> int:
    """frac x the working set (x2 with two groups), at least what the longest request
    needs alone (its full-attention blocks plus a window and a chunk, or a chunk's states)."""
    full = -(-longest // block_size)
    if kind == "full":
        return max(int(frac * reusable), full) + 1
    side = (window - 1 + TOKEN_BUDGET) // block_size + 2 if kind == "swa" \
        else TOKEN_BUDGET // block_size + 2
    return max(2 * int(frac * reusable), full + min(side, full + 1)) + 1


def ideal_spacings(kind: str, block_size: int, window: int) -> list[int]:
    """Fallback checkpoint spacings (tokens) tried for the clairvoyant reference."""
    if kind == "full":
        return [0]
    if kind == "swa":
        return [0, 4 * window, 8 * window]
    return sorted({0, 4 * block_size, 16 * block_size, 1024, 4096})


def run_policy(trace, kind: str, num_blocks: int, block_size: int, window: int,
               policy: str) -> dict[str, Any]:
    config = make_config(kind, num_blocks, block_size=block_size, window=window)
    with manager_settings(policy):
        manager = KVCacheManager(config, eviction_policy=policy)
        stats = replay(trace.requests, ManagerAdapter(manager), max_running=trace.max_running,
                       max_batched_tokens=TOKEN_BUDGET)
    if manager.num_free_blocks != num_blocks - 1:
        raise AssertionError(f"{policy} leaked blocks on {trace.name} seed {trace.seed}")
    return {"hit": round(stats.hit_rate, 5), "preemptions": stats.preemptions}


def run_ideal(trace, index, kind: str, num_blocks: int, block_size: int,
              window: int) -> dict[str, Any]:
    best: dict[str, Any] = {"hit": -1.0}
    for spacing in ideal_spacings(kind, block_size, window):
        cache = ClairvoyantCache(trace.requests, kind, num_blocks, block_size, window,
                                 index=index, checkpoint_tokens=spacing)
        stats = replay(trace.requests, cache, max_running=trace.max_running,
                       max_batched_tokens=TOKEN_BUDGET)
        if cache.num_free_blocks != num_blocks - 1:
            raise AssertionError(f"the clairvoyant cache leaked blocks on {trace.name}")
        if stats.hit_rate > best["hit"]:
            best = {"hit": round(stats.hit_rate, 5), "spacing": spacing}
    return best


def run_task(task: dict[str, Any]) -> list[dict[str, Any]]:
    """Every cell of one (shape, seed, block size): policies and, unless cached, the ideal."""
    warnings.simplefilter("ignore", RuntimeWarning)  # repeated misses are the point here
    trace = with_concurrency(grid_trace(task["shape"], task["seed"]), task["concurrency"])
    bs = task["block_size"]
    index = PrefixIndex(trace.requests, bs)
    reusable = reusable_blocks(index)
    longest = max(len(r.prompt) + len(r.output) for r in trace.requests)
    fingerprint = trace.fingerprint()
    rows = []
    for kind, window in task["configs"]:
        for frac in task["fracs"]:
            nb = pool_blocks(kind, frac, reusable, longest, bs, window)
            key = (f"{trace.name}/{trace.seed}/{bs}/{kind}/{window}/{nb}/{fingerprint}"
                   f"/c{trace.max_running}")
            row = {"shape": shape_name(trace.name, task["concurrency"]), "seed": trace.seed,
                   "block_size": bs, "kind": kind, "window": window, "frac": frac,
                   "num_blocks": nb, "key": key,
                   "ceiling": round(reuse_ceiling(index), 5)}
            for policy in task["policies"]:
                row[policy] = run_policy(trace, kind, nb, bs, window, policy)
            ideal = task["ideal_cache"].get(key)
            row["ideal"] = ideal or run_ideal(trace, index, kind, nb, bs, window)
            rows.append(row)
    return rows


def shape_name(name: str, concurrency: int) -> str:
    """A shape on the grid: its name, and the requests in flight where the grid sets them."""
    return f"{name}/c{concurrency}" if concurrency > 0 else name


def parse_list(text: str, cast=str) -> list:
    out = []
    for part in text.split(","):
        if "-" in part and cast is int:
            lo, hi = part.split("-")
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(cast(part))
    return out


def load_plugin(path: str) -> None:
    """Import a file that registers extra policies (register_eviction_policy)."""
    spec = importlib.util.spec_from_file_location("grid_plugin", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--plugin {path!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules["grid_plugin"] = module
    spec.loader.exec_module(module)


def build_tasks(grid: dict[str, Any], policies: list[str],
                ideal_cache: dict[str, Any]) -> list[dict[str, Any]]:
    configs = [(k, w) for k in grid["kinds"] for w in (grid["windows"] if k == "swa" else [0])]
    tasks = [{"shape": s, "seed": seed, "block_size": bs, "configs": configs,
              "fracs": grid["fracs"], "policies": policies, "ideal_cache": ideal_cache,
              "concurrency": c}
             for s in grid["shapes"] for seed in grid["seeds"] for bs in grid["block_sizes"]
             for c in (grid["concurrency"] if s in VLLM_SHAPES else [0])]
    tasks.sort(key=lambda t: (t["block_size"], t["shape"] in ("long_doc", "fewshot")),
               reverse=False)
    return tasks[::-1]  # the longest first: better balance over the workers


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset for iteration")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "hybridkv-grid"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--policies", default="lru,hybrid")
    ap.add_argument("--plugin", default=None, help="a file registering extra policies")
    for name in ("shapes", "seeds", "block_sizes", "fracs", "windows", "kinds", "concurrency"):
        ap.add_argument("--" + name.replace("_", "-"), default=None)
    args = ap.parse_args(argv)
    if args.plugin:
        load_plugin(args.plugin)
    grid = dict(QUICK_GRID if args.quick else FULL_GRID)
    casts = {"seeds": int, "block_sizes": int, "fracs": float, "windows": int,
             "concurrency": int}
    for name in ("shapes", "seeds", "block_sizes", "fracs", "windows", "kinds", "concurrency"):
        value = getattr(args, name)
        if value is not None:
            grid[name] = parse_list(value, casts.get(name, str))
    policies = parse_list(args.policies)
    os.makedirs(args.out, exist_ok=True)
    cache_path = os.path.join(args.out, "ideal_cache.json")
    ideal_cache = json.load(open(cache_path)) if os.path.exists(cache_path) else {}
    tasks = build_tasks(grid, policies, ideal_cache)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(args.workers) as pool:
        for done, task_rows in enumerate(pool.imap_unordered(run_task, tasks), 1):
            rows += task_rows
            print(f"  {done}/{len(tasks)} tasks, {time.perf_counter() - t0:.0f} s", flush=True)
    for row in rows:
        ideal_cache[row["key"]] = row["ideal"]
    with open(cache_path, "w") as f:
        json.dump(ideal_cache, f)
    summary = summarize(rows, policies)
    result = {"grid": grid, "policies": policies, "seconds": round(time.perf_counter() - t0, 1),
              "summary": summary, "rows": rows}
    with open(os.path.join(args.out, "grid.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(write_markdown(summary, policies))
    print(f"wrote {os.path.join(args.out, 'grid.json')} ({result['seconds']} s)")
    return result


if __name__ == "__main__":
    main()
