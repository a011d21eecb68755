"""Hit rate under pressure over several trace seeds, per eviction policy.

The pressure workloads (../shared/bench/pressure_traces.py) are fixed-seed
traces; a retention rule can look better or worse on one trace by chance
(which prefix happens to be evicted first changes everything after it). This
runs the same settings with other seeds and reports the mean per policy, so a
policy change is judged on more than the one trace the targets use.

    python benchmarks/bench_pressure_seeds.py [--seeds 6] [--policies lru,hybrid]
        [--configs full,swa,mamba] [--settings multi_turn@40,fewshot@50,long_doc@40]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings

from common import shared_bench_dir, write_result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6, help="trace seeds: the official one + N-1")
    ap.add_argument("--policies", default="lru,hybrid")
    ap.add_argument("--configs", default="full,swa,mamba")
    ap.add_argument("--settings", default="multi_turn@40,fewshot@50,long_doc@40")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    sys.path.insert(0, shared_bench_dir())
    import hybridkv_bench as hb  # noqa: E402  (the shared runner's adapter and configs)
    import pressure_bench as pb  # noqa: E402
    import traces  # noqa: E402

    warnings.simplefilter("ignore", RuntimeWarning)  # the repeated-miss warning is expected
    rows = []
    t0 = time.perf_counter()
    for name in args.settings.split(","):
        if name not in pb.SETTINGS:
            ap.error(f"unknown setting {name!r}; known: {', '.join(pb.SETTINGS)}")
        settings = []
        for k in range(args.seeds):
            spec = copy.deepcopy(pb.SETTINGS[name])
            spec["kwargs"]["seed"] += 100 * k  # k = 0: the official trace
            settings.append(pb.Setting(name, spec, False))
        for config in args.configs.split(","):
            row = {"setting": name, "config": config}
            for policy in args.policies.split(","):
                hits = []
                for st in settings:
                    cfg = hb.make_config(config, st.num_blocks(config, False), pb.WINDOW)
                    eng = hb.HybridkvEngine(cfg, "sha256")
                    eng.mgr = hb.hybridkv.KVCacheManager(cfg, eviction_policy=policy)
                    res = traces.replay(st.trace, eng, max_running=st.max_running,
                                        max_batched_tokens=8192)
                    hits.append(round(res.hit_rate, 4))
                row[policy] = {"mean": round(statistics.mean(hits), 4), "per_seed": hits}
            rows.append(row)
            print(f"{name:14s} {config:6s} " + "  ".join(
                f"{p} mean {row[p]['mean']:.4f} {row[p]['per_seed']}"
                for p in args.policies.split(",")), flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    print("wrote", write_result("pressure_seeds", {"seeds": args.seeds, "rows": rows}))
    return {"rows": rows}


if __name__ == "__main__":
    main()
