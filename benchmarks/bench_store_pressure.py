"""Hit rate under memory pressure with a cpu KV tier of 1x, 2x and 4x the device pool.

The pressure settings of `hybridkv.tools.pressure` (round-robin multi-turn
chat, branching few-shot headers, long-document QA; pools of 40-50% of the
reusable working set; the driver of `hybridkv.tools.replay`) replayed through
KVCacheManager with a `KVTier` over a `cpu://` store holding `--tiers` times
the pool's block count (simulated pages: no model, the bookkeeping is the
engine's). The hit rate counts prompt tokens reused from either tier at first
admission, against the infinite-pool ceiling. Each tier size runs with both
selections of what to store: `hybrid` (full-attention blocks, and the windows
and states a likely hit needs) and `all` (every evicted block).

    python benchmarks/bench_store_pressure.py [--out DIR] [--quick]
        [--settings multi_turn@40,...] [--configs full,swa,mamba] [--tiers 1,2,4]

Writes DIR/store_pressure.json.
"""

from __future__ import annotations

import argparse
import time

from common import add_common_args, prepare_out, write_result

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.store import CpuStore
from hybridkv.store.cpu import ENTRY_OVERHEAD
from hybridkv.store.keys import FINGERPRINT_BYTES, KEY_PREFIX
from hybridkv.store.pages import SimulatedPages
from hybridkv.store.payload import HEADER_BYTES
from hybridkv.store.tier import KVTier
from hybridkv.store.writer import DEFAULT_INLINE_BYTES
from hybridkv.tools.pressure import MAX_BATCHED_TOKENS, SETTINGS, pool_blocks
from hybridkv.tools.replay import ManagerAdapter, make_config, replay
from hybridkv.tools.traces import reuse_stats

PAGE_BYTES = 64  # simulated block data: the store is sized in blocks, not bytes


def entry_bytes(hash_bytes: int = 32) -> int:
    """What one stored block costs the cpu store here (key, header, data, overhead)."""
    key = len(KEY_PREFIX) + FINGERPRINT_BYTES + 2 + hash_bytes
    return key + HEADER_BYTES + PAGE_BYTES + ENTRY_OVERHEAD


class TieredAdapter(ManagerAdapter):
    """The replay driver's adapter with a KV tier consulted at every lookup.

    Evicted blocks are handed to the writer at every lookup (the engine does it
    before every model step); `flush_each_lookup` also waits until they are in
    the store, so runs are deterministic.
    """

    def __init__(self, config: KVCacheConfig, tier_blocks: int, select: str, *,
                 eviction_policy: str | None = None, flush_each_lookup: bool = True,
                 inline_write_bytes: int = DEFAULT_INLINE_BYTES) -> None:
        kwargs = {"eviction_policy": eviction_policy} if eviction_policy else {}
        super().__init__(KVCacheManager(config, **kwargs))
        self.flush_each_lookup = flush_each_lookup
        self.tier = None
        if tier_blocks:
            pages = SimulatedPages(config.num_blocks, len(config.kv_cache_groups), PAGE_BYTES)
            self.tier = KVTier(self.manager, CpuStore(tier_blocks * entry_bytes()), pages,
                               b"pressure-bench!!", select=select,
                               inline_write_bytes=inline_write_bytes)

    def lookup(self, req: Request) -> int:
        blocks, num_cached = self.manager.get_computed_blocks(req)
        if self.tier is not None:  # (as the engine's scheduler: wait while others hold blocks)
            self.tier.before_step()
            if self.flush_each_lookup:
                self.tier.flush()
            blocks, num_cached, _, wait = self.tier.extend_hit(
                req, blocks, num_cached, MAX_BATCHED_TOKENS, can_wait=self.manager.usage > 0)
            if wait:  # the store holds a longer hit than fits now: the admission waits
                self.allocate = self._wait  # type: ignore[method-assign]
        self._hits[req.request_id] = (blocks, num_cached)
        return num_cached

    def _wait(self, req: Request, num_tokens: int) -> bool:
        """The next allocation (this admission's) is refused: admit it later. (Set
        only then, so that every other allocation goes straight to the manager.)"""
        del self.allocate
        self._hits.pop(req.request_id, None)
        return False


def run_row(name: str, config: str, tier: int, select: str, quick: bool) -> dict:
    setting = SETTINGS[name]
    trace = setting.trace(quick=quick)
    stats = reuse_stats(trace)
    num_blocks = pool_blocks(stats, setting.pool_fraction, config)
    adapter = TieredAdapter(make_config(config, num_blocks), tier * num_blocks, select)
    res = replay(trace.requests, adapter, max_running=setting.max_running,
                 max_batched_tokens=MAX_BATCHED_TOKENS, timed=True)
    row = {"setting": name, "config": config, "num_blocks": num_blocks, "tier": tier,
           "select": select, "fingerprint": trace.fingerprint(),
           "hit_rate": round(res.hit_rate, 5),
           "ceiling_hit_rate": round(stats.ceiling_hit_rate, 5),
           "over_ceiling": round(res.hit_rate / stats.ceiling_hit_rate, 4),
           "finished": res.finished, "complete": res.finished == len(trace.requests),
           "requests_per_s": round(res.requests_per_s, 1), "preemptions": res.preemptions,
           "leak_free": adapter.num_free_blocks == num_blocks - 1}
    if adapter.tier is not None:
        adapter.tier.flush()  # (blocks still queued count as written)
        st = adapter.tier.stats()
        row.update(store_hit_tokens=st.hit_tokens, written_blocks=st.written_blocks,
                   loaded_blocks=st.loaded_blocks, store_keys=st.store.keys,
                   written_by_group=[g.written_blocks for g in st.groups])
        adapter.tier.close()
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--tiers", default="1,2,4", help="tier sizes in multiples of the pool")
    ap.add_argument("--selects", default="hybrid,all")
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    if args.quick:  # small traces of the same shapes, the 4x hybrid tier only
        args.tiers, args.selects = "4", "hybrid"
    t0 = time.perf_counter()
    rows = []
    for name in args.settings.split(","):
        if name not in SETTINGS:
            raise SystemExit(f"--settings: {name!r} is unknown; use {', '.join(SETTINGS)}")
        for config in args.configs.split(","):
            variants = [(0, "-")] + [(int(t), s) for t in args.tiers.split(",")
                                     for s in args.selects.split(",")]
            for tier, select in variants:
                row = run_row(name, config, tier, select, args.quick)
                rows.append(row)
                print(f"{name:<14} {config:<6} tier {tier}x {select:<7} hit {row['hit_rate']:.4f}"
                      f" / ceiling {row['ceiling_hit_rate']:.4f} = {row['over_ceiling']:.3f}"
                      f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    result = {"args": vars(args), "rows": rows, "total_s": round(time.perf_counter() - t0, 1)}
    print("wrote", write_result("store_pressure", result, args.out))
    return result


if __name__ == "__main__":
    main()
