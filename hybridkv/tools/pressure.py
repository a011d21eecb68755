"""Hit rate under memory pressure: the settings and one replay per (setting, config).

A setting is a trace shape from `hybridkv.tools.bench_traces`, a pool
fraction and a running-request cap. The pool is the fraction of the trace's
reusable full-attention working set (`hybridkv.tools.traces.reuse_stats`); a config with G groups
gets G times as many blocks (the same bytes: a block's page then covers 1/G
of the layers), and never fewer than the longest request needs alone.

    >>> row = run_setting("fewshot@50", "swa", quick=True)
    >>> sorted(row)[:3]
    ['ceiling_hit_rate', 'config', 'finished']

`multi_turn@40` (round-robin chats, 40% of the working set, 4 running),
`fewshot@50` (branching few-shot headers, 50%, 12 running) and `long_doc@40`
(long-document QA, 40%, 4 running) are the settings of
`benchmarks/bench_pressure.py`; `quick=True` gives small traces of the same
shapes. Other shapes, seeds and fractions go through `make_setting`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.tools.bench_traces import branching_fewshot, long_doc_qa, multi_turn_round_robin
from hybridkv.tools.replay import CONFIG_GROUPS, ManagerAdapter, make_config, replay
from hybridkv.tools.traces import ReuseStats, Trace, reuse_stats

MAX_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class PressureSetting:
    """A trace generator with its arguments, a pool fraction and a running cap."""

    name: str
    generator: Callable[..., Trace]
    pool_fraction: float
    max_running: int
    kwargs: dict = field(default_factory=dict)
    quick_kwargs: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        """The seed of the setting's official trace."""
        default = inspect.signature(self.generator).parameters["seed"].default
        return int(self.kwargs.get("seed", default))

    def trace(self, *, seed: int | None = None, quick: bool = False) -> Trace:
        kwargs = {**self.kwargs, **(self.quick_kwargs if quick else {})}
        if seed is not None:
            kwargs["seed"] = seed
        return self.generator(**kwargs)


SETTINGS = {
    "multi_turn@40": PressureSetting(
        "multi_turn@40", multi_turn_round_robin, 0.40, 4,
        quick_kwargs=dict(num_sessions=8, num_turns=3, system_len=64, first_message=(128, 256),
                          message=(24, 64))),
    "fewshot@50": PressureSetting(
        "fewshot@50", branching_fewshot, 0.50, 12,
        quick_kwargs=dict(num_requests=40, system_len=40, question=(12, 40),
                          tree=((40, (50, 140)), (110, (90, 1100))))),
    "long_doc@40": PressureSetting(
        "long_doc@40", long_doc_qa, 0.40, 4,
        quick_kwargs=dict(doc_lens=(1500, 2200, 3000), questions_per_doc=3, preamble_len=48)),
}


def make_setting(name: str, generator: Callable[..., Trace], pool_fraction: float,
                 max_running: int, **kwargs) -> PressureSetting:
    """A setting of your own (another shape, fraction or size), for `run_setting`."""
    if not 0 < pool_fraction:
        raise ValueError(f"pool_fraction must be > 0, got {pool_fraction!r}")
    return PressureSetting(name, generator, pool_fraction, max_running, kwargs)


def pool_blocks(stats: ReuseStats, pool_fraction: float, config: str) -> int:
    """Blocks of a `config` pool holding `pool_fraction` of the working set."""
    groups = CONFIG_GROUPS[config]
    return max(int(pool_fraction * stats.reusable_blocks) * groups,
               stats.max_request_blocks * groups + 16)


def run_setting(setting: str | PressureSetting, config: str, *, policy: str | None = None,
                seed: int | None = None, quick: bool = False, hash_algo: str = "sha256",
                time_budget_s: float | None = None) -> dict:
    """Replay one setting on one config; the row of figures (hit rate, requests/s, ...)."""
    if isinstance(setting, str):
        if setting not in SETTINGS:
            raise ValueError(f"setting {setting!r} is unknown; use one of {', '.join(SETTINGS)}")
        setting = SETTINGS[setting]
    trace = setting.trace(seed=seed, quick=quick)
    stats = reuse_stats(trace)
    num_blocks = pool_blocks(stats, setting.pool_fraction, config)
    kwargs = {"eviction_policy": policy} if policy else {}
    adapter = ManagerAdapter(KVCacheManager(make_config(config, num_blocks),
                                            hash_algo=hash_algo, **kwargs))
    free_before = adapter.num_free_blocks
    res = replay(trace.requests, adapter, max_running=setting.max_running,
                 max_batched_tokens=MAX_BATCHED_TOKENS, time_budget_s=time_budget_s, timed=True)
    complete = res.finished == len(trace.requests)
    return {"setting": setting.name, "config": config, "policy": policy or "default",
            "fingerprint": trace.fingerprint(), "num_blocks": num_blocks,
            "hit_rate": round(res.hit_rate, 4),
            "ceiling_hit_rate": round(stats.ceiling_hit_rate, 4),
            "reusable_blocks": stats.reusable_blocks,
            "requests_per_s": round(res.requests_per_s, 1), "preemptions": res.preemptions,
            "evictions": adapter.manager.prefix_cache_stats.evictions,
            "finished": res.finished, "complete": complete,
            "leak_free": adapter.num_free_blocks == free_before if complete else None,
            "wall_s": round(res.wall_s, 3)}
