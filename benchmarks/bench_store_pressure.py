"""Hit rate under memory pressure with a cpu KV tier of 2x and 4x the device pool.

The pressure workloads and driver of the shared workload folder (../shared/bench:
`pressure_bench.SETTINGS`, `traces.replay`; round-robin multi-turn chat,
branching few-shot headers, long-document QA; pools of 40-50% of the reusable
working set) replayed through KVCacheManager with a `KVTier` over a `cpu://`
store holding `--tiers` times the pool's block count (simulated pages: no model,
the bookkeeping is the engine's). The hit rate counts prompt tokens reused from
either tier at first admission, against the infinite-pool ceiling. Each tier
size runs with both selections of what to store: `hybrid` (full-attention
blocks, and the windows and states a likely hit needs) and `all` (every
evicted block).

    python benchmarks/bench_store_pressure.py --out /tmp/store-bench [--small]
        [--settings multi_turn@40,...] [--configs full,swa,mamba] [--tiers 2,4]

Results: `store_pressure.json` in `--out` (default ./hybridkv-bench-output).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

from common import shared_bench_dir, write_result

sys.path.insert(0, shared_bench_dir())
import hybridkv_bench as hb  # noqa: E402
import pressure_bench as pb  # noqa: E402
import traces  # noqa: E402

from hybridkv import KVCacheManager  # noqa: E402
from hybridkv.store import CpuStore  # noqa: E402
from hybridkv.store.cpu import ENTRY_OVERHEAD  # noqa: E402
from hybridkv.store.keys import FINGERPRINT_BYTES, KEY_PREFIX  # noqa: E402
from hybridkv.store.pages import SimulatedPages  # noqa: E402
from hybridkv.store.payload import HEADER_BYTES  # noqa: E402
from hybridkv.store.tier import KVTier  # noqa: E402

PAGE_BYTES = 64  # simulated block data: the store is sized in blocks, not bytes


def entry_bytes(hash_bytes: int) -> int:
    """What one stored block costs the cpu store here (key, header, data, overhead)."""
    key = len(KEY_PREFIX) + FINGERPRINT_BYTES + 2 + hash_bytes
    return key + HEADER_BYTES + PAGE_BYTES + ENTRY_OVERHEAD


class TieredEngine(hb.HybridkvEngine):
    """The shared adapter with a KV tier consulted at every lookup."""

    def __init__(self, config, args, tier_blocks: int, select: str,
                 flush_each_step: bool = True) -> None:
        self.mgr = KVCacheManager(config, enable_caching=True, hash_algo=args.hash_algo,
                                  eviction_policy=args.eviction_policy)
        self.hits = {}
        self.budget = args.max_batched_tokens
        self.wait = False
        self.flush_each_step = flush_each_step
        self.tier = None
        if tier_blocks:
            hash_bytes = 32 if args.hash_algo == "sha256" else 16
            store = CpuStore(tier_blocks * entry_bytes(hash_bytes))
            pages = SimulatedPages(config.num_blocks, len(config.kv_cache_groups), PAGE_BYTES)
            self.tier = KVTier(self.mgr, store, pages, b"pressure-bench!!", select=select)

    def lookup(self, req):
        blocks, n = self.mgr.get_computed_blocks(req)
        self.wait = False
        if self.tier is not None:  # (as the engine's scheduler: wait while others hold blocks)
            blocks, n, _, self.wait = self.tier.extend_hit(req, blocks, n, self.budget,
                                                           can_wait=self.mgr.usage > 0)
        self.hits[req.request_id] = (blocks, n)
        return n

    def allocate_prefill(self, req, n):
        if self.wait:  # the store holds a longer hit than fits now: admit it later
            self.hits.pop(req.request_id, None)
            self.wait = False
            return False
        return super().allocate_prefill(req, n)

    def end_step(self):
        if self.tier is not None:
            self.tier.before_step()  # (the engine does this before each model step)
            if self.flush_each_step:
                self.tier.flush()  # the writer's puts land in step order: deterministic runs


def run_row(setting, config: str, tier: int, select: str, args) -> dict:
    nb = setting.num_blocks(config, False)
    eng = TieredEngine(hb.make_config(config, nb, pb.WINDOW), args, tier * nb, select)
    gc.collect()
    res = traces.replay(setting.trace, eng, max_running=setting.max_running,
                        max_batched_tokens=args.max_batched_tokens,
                        time_budget_s=args.time_budget)
    d = res.as_dict()
    row = {"setting": setting.name, "config": config, "num_blocks": nb, "tier": tier,
           "select": select, "hit_rate": d["hit_rate"],
           "ceiling_hit_rate": round(setting.ceiling, 5),
           "over_ceiling": round(d["hit_rate"] / setting.ceiling, 4),
           "finished": d["finished"], "complete": d["finished"] == len(setting.trace.requests),
           "requests_per_s": d["requests_per_s"], "preemptions": d["preemptions"],
           "leak_free": eng.num_free_blocks() == nb - 1}
    if eng.tier is not None:
        stats = eng.tier.stats()
        row.update(store_hit_tokens=stats.hit_tokens, written_blocks=stats.written_blocks,
                   loaded_blocks=stats.loaded_blocks, store_keys=stats.store.keys,
                   written_by_group=[g.written_blocks for g in stats.groups])
        eng.tier.close()
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default=",".join(pb.SETTINGS))
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--tiers", default="2,4", help="tier sizes in multiples of the pool")
    ap.add_argument("--selects", default="hybrid,all")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--max-batched-tokens", type=int, default=8192)
    ap.add_argument("--hash-algo", default="sha256")
    ap.add_argument("--eviction-policy", default="hybrid")
    ap.add_argument("--time-budget", type=float, default=600.0)
    ap.add_argument("--out", default="hybridkv-bench-output")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for name in args.settings.split(","):
        setting = pb.Setting(name, pb.SETTINGS[name], args.small)
        for config in args.configs.split(","):
            variants = [(0, "-")] + [(int(t), s) for t in args.tiers.split(",")
                                     for s in args.selects.split(",")]
            for tier, select in variants:
                row = run_row(setting, config, tier, select, args)
                rows.append(row)
                print(f"{name:<14} {config:<6} tier {tier}x {select:<7} hit {row['hit_rate']:.4f}"
                      f" / ceiling {row['ceiling_hit_rate']:.4f} = {row['over_ceiling']:.3f}"
                      f"  req/s {row['requests_per_s']:.0f}"
                      f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    result = {"args": vars(args), "rows": rows, "total_s": round(time.perf_counter() - t0, 1)}
    os.makedirs(args.out, exist_ok=True)
    print("wrote", write_result("store_pressure", result,
                                os.path.join(args.out, "store_pressure.json")))
    return result


if __name__ == "__main__":
    main()
