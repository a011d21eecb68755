"""Stateful fuzzing of KVCacheManager: a hypothesis machine with a shadow of block contents.

Each example builds a manager for one named config (`CONFIGS`: every
attention type alone and in hybrid mixes, with different block sizes, sinks
and Mamba checkpoint intervals), an eviction policy ("lru" or "hybrid"), a
hash algorithm and a pool size, then runs random rules: new requests sharing
prefixes (some with a cache_salt or lora_name), lookups, admissions adopting
the hit, prefill chunks and decodes, appends, advances, frees, preemptions,
evictions of chosen blocks and prefix-cache resets. After every rule:

- `check_integrity()`, ref counts equal the running requests' holders, the
  free queue is exactly the blocks nobody holds (`holder_problem`), and
  `num_free_blocks == num_blocks - 1 - held` (sinks included);
- a block listed by two requests sits at one (group, position) in both and
  is (or was, until `evict_blocks`) a cached block;
- the shadow (`ShadowCache`): every listed block still holds its request's
  tokens, hits hold the querying request's tokens, every hash-map entry
  keys its block's content.

Lookups are also checked against the brute-force hybrid oracle, and a
refused allocation must leave `state_snapshot` unchanged.

    from hypothesis.stateful import run_state_machine_as_test
    run_state_machine_as_test(make_machine(["full_sliding_mamba"]))

The configs are `hybridkv.tools.spec_mixes.CONFIGS`; the machine itself is
`fuzz_machine` (it imports this module's constants, so it is imported when a
machine is made).

`run_fuzz(seconds=...)` keeps running fresh examples until time is up and
returns what it ran and every failure it found.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from hybridkv.tools.spec_mixes import CONFIGS

if TYPE_CHECKING:
    from support.fuzz_machine import KVCacheMachine

EVICTION_POLICIES = ("lru", "hybrid")
VOCAB = 6  # a small alphabet: unrelated requests share short prefixes too
MAX_PROMPT = 40  # tokens cut from a base; follow-up turns reach twice that
BASES = [[(5 * i + 3 * j + j * j) % VOCAB for j in range(MAX_PROMPT)] for i in range(3)]
SALTS = (None, None, "tenant-a", "tenant-b")
LORAS = (None, None, None, "adapter-x")


@dataclass
class FuzzStats:
    """What the machine exercised (shared by every example of a machine class)."""

    examples: int = 0
    steps: int = 0
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    allocations: int = 0
    refusals: int = 0
    decoded_tokens: int = 0
    preemptions: int = 0
    explicit_evictions: int = 0
    resets: int = 0
    configs: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        out = {k: v for k, v in vars(self).items() if k != "configs"}
        return {**out, "configs": dict(sorted(self.configs.items()))}


def make_machine(config_names: Sequence[str] | None = None,
                 policies: Sequence[str] = EVICTION_POLICIES,
                 stats: FuzzStats | None = None,
                 check_oracle: bool = True) -> type[KVCacheMachine]:
    """A machine class over `config_names` (default: all) and `policies`,
    counting into `stats` (a fresh FuzzStats by default: `cls.stats`).
    `check_oracle=False` leaves lookups to the shadow checks alone."""
    names = list(config_names) if config_names is not None else list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise ValueError(f"unknown fuzz configs {unknown}; known: {sorted(CONFIGS)}")
    bad = [p for p in policies if p not in EVICTION_POLICIES]
    if bad or not policies:
        raise ValueError(f"eviction policies {bad or policies!r}; use {EVICTION_POLICIES}")
    attrs = {"config_names": tuple(names), "policies": tuple(policies),
             "stats": stats if stats is not None else FuzzStats(), "check_oracle": check_oracle}
    from support.fuzz_machine import KVCacheMachine  # the machine imports this module

    return type("KVCacheMachine", (KVCacheMachine,), attrs)


def fuzz_settings(max_examples: int, *, steps: int = 50, derandomize: bool = True,
                  shrink: bool = True) -> Any:
    """Hypothesis settings for the machine (no example database, no deadline)."""
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(max_examples=max_examples, stateful_step_count=steps, deadline=None,
                    derandomize=derandomize, database=None, phases=phases,
                    suppress_health_check=list(HealthCheck))


@dataclass
class FuzzResult:
    """What `run_fuzz` ran and the failures it found (one text each)."""

    seconds: float
    runs: int
    stats: FuzzStats
    violations: list[str]


def run_fuzz(seconds: float, *, config_names: Sequence[str] | None = None,
             examples_per_run: int = 50, steps: int = 50) -> FuzzResult:
    """Run the machine on fresh random examples for about `seconds`.

    Each run is one hypothesis test of `examples_per_run` examples; a failing
    run is shrunk and its minimal program recorded, then fuzzing continues.
    """
    machine = make_machine(config_names)
    violations: list[str] = []
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        runs += 1
        try:
            run_state_machine_as_test(machine, settings=fuzz_settings(
                examples_per_run, steps=steps, derandomize=False))
        except Exception as error:  # a violation: keep it and go on
            notes = "\n".join(getattr(error, "__notes__", []))
            violations.append(f"{type(error).__name__}: {error}\n{notes}")
    return FuzzResult(time.perf_counter() - start, runs, machine.stats, violations)
