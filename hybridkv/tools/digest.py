"""Replay digests: one hash of everything a KV cache manager decided on a set of workloads.

A speed-only change must leave every decision as it was: the same block ids
handed out in the same order, the same hits, the same stats, events,
evictions and free-queue order. `run_digests` replays fixed workloads and
hashes all of it per scenario:

- `shared/...`: the scheduler-path trace (`shared_prefix_trace`) on the full,
  swa and mamba configs, with a roomy pool and a small one (evictions,
  preemptions);
- `pressure/...`: the pressure settings (`hybridkv.tools.pressure`, small
  traces of the same shapes);
- `random/...`: seeded random traffic on every group mix of the fuzz configs
  (sinks, chunked attention, Mamba intervals, mixed block sizes), with
  salts, LoRA names, chunked prefills, preemptions, explicit evictions and
  prefix-cache resets.

each under the `lru` and `hybrid` policies. Recorded per call: the hit (block
ids per group, tokens), the blocks an allocation returned (or None, or the
error), the request's block ids and retained block ids after it; at the end
the prefix-cache stats, the free queue in eviction order and the hash map;
in scenarios with listeners, every event and evicted or stale block.

    python -m hybridkv.tools.digest [--quick] [--only PREFIX]

prints one JSON object: scenario -> digest (16 hex digits), and `all`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import warnings
from collections.abc import Callable, Iterator
from functools import partial

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from hybridkv.tools.bench_traces import shared_prefix_trace
from hybridkv.tools.digest_traffic import RandomTraffic, Recorder, TraceDriver
from hybridkv.tools.pressure import SETTINGS, pool_blocks, reuse_stats
from hybridkv.tools.spec_mixes import CONFIGS

POLICIES = ("lru", "hybrid")


def _replay_digest(trace, config: KVCacheConfig, policy: str, max_running: int,
                   listen: bool) -> str:
    rec = Recorder()
    kv = KVCacheManager(config, eviction_policy=policy, warn_repeated_misses=False)
    if listen:
        rec.listen(kv)
    TraceDriver(kv, rec, max_running).run(trace.requests)
    rec.final_state(kv)
    return rec.hexdigest()


def make_config(kind: str, num_blocks: int) -> KVCacheConfig:
    """The scheduler-path configs: full attention, + a 1,024-token window, or + Mamba."""
    groups = [KVCacheGroupSpec(["full"], FullAttentionSpec(16))]
    if kind == "swa":
        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(16, sliding_window=1024)))
    elif kind == "mamba":
        groups.append(KVCacheGroupSpec(["mamba"], MambaSpec(16)))
    return KVCacheConfig(num_blocks, groups)


def shared_scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], str]]]:
    trace = shared_prefix_trace(num_requests=100 if quick else 300,
                                unique_len=256, decode_steps=40 if quick else 64)
    for config in ("full", "swa", "mamba"):
        for num_blocks in (4096, 900):
            for policy in POLICIES:
                name = f"shared/{config}/{num_blocks}/{policy}"
                yield name, partial(_replay_digest, trace, make_config(config, num_blocks),
                                    policy, 64, num_blocks < 4096)


def pressure_scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], str]]]:
    for setting in SETTINGS.values():
        trace = setting.trace(quick=True)
        stats = reuse_stats(trace)
        for config in ("full", "swa", "mamba"):
            num_blocks = pool_blocks(stats, setting.pool_fraction, config)
            for policy in POLICIES:
                yield (f"pressure/{setting.name}/{config}/{policy}",
                       partial(_replay_digest, trace, make_config(config, num_blocks), policy,
                               setting.max_running, True))


def random_scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], str]]]:
    seeds = (0,) if quick else (0, 1, 2)
    for mix, specs in CONFIGS.items():
        groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]
        for policy in POLICIES:
            for seed in seeds:
                yield (f"random/{mix}/{policy}/{seed}",
                       partial(_random_digest, groups, policy, seed, 150 if quick else 400))


def _random_digest(groups: list[KVCacheGroupSpec], policy: str, seed: int, steps: int) -> str:
    rec = Recorder()
    RandomTraffic(groups, policy, seed, rec).run(steps)
    return rec.hexdigest()


SCENARIOS = {"shared": shared_scenarios, "pressure": pressure_scenarios,
             "random": random_scenarios}


def run_digests(quick: bool = False, only: str = "") -> dict[str, str]:
    """scenario name -> digest, and `all` over every one of them."""
    out: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for scenarios in SCENARIOS.values():
            for name, compute in scenarios(quick):
                if name.startswith(only):
                    out[name] = compute()
    whole = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]
    return {**out, "all": whole}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller workloads (seconds)")
    ap.add_argument("--only", default="", help="scenarios whose name starts with this")
    args = ap.parse_args(argv)
    print(json.dumps(run_digests(args.quick, args.only), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
