"""Which CPU cores the engine thread may run on (`hybridkv serve --cpu-bind`).

The engine thread runs every model step; the event loop and the text threads around it
need a core only briefly per step. vLLM's CPU worker binds itself by default: its compute
threads to all cores but one, that one left to the rest of the server
(`VLLM_CPU_OMP_THREADS_BIND` `auto`, one core reserved); this option does the same for
the engine thread, so the two servers can be compared placed alike. On a busy shared
machine an engine thread spent about half its time runnable but waiting for a core,
bound or not, and binding showed no consistent effect on throughput
(benchmarks/RESULTS.md, "Served decode, and the `random` workload").

`--cpu-bind none` (the default) leaves the scheduler alone: several servers on one
machine would otherwise all bind the same cores. `auto` binds the engine thread to the
first `threads` cores this process may use when at least one more is left for the
rest (else nothing is bound); a list such as `0` or `2-3` names the cores.
Only the engine thread is bound; torch threads it starts later inherit its cores.
"""

from __future__ import annotations

import os


def parse_cpu_bind(spec: str, threads: int | None) -> frozenset[int] | None:
    """The cores named by `spec` ("none", "auto" or a list like "0,2-3"), or None for
    no binding. ValueError naming `spec` when it is malformed, names a core this process
    may not use, or the platform cannot bind threads."""
    spec = spec.strip().lower()
    if spec == "none":
        return None
    allowed = _allowed_cores(spec)
    if spec == "auto":
        return auto_cores(sorted(allowed), threads)
    cores = _parse_list(spec)
    outside = sorted(cores - allowed)
    if outside:
        raise ValueError(f"--cpu-bind {spec!r}: cores {outside} are not available to this "
                         f"process (it may use {sorted(allowed)})")
    return frozenset(cores)


def auto_cores(allowed: list[int], threads: int | None) -> frozenset[int] | None:
    """The first `threads` (at least 1) of `allowed` when at least one is left over.

    Example: allowed [0, 1], threads 1 -> {0}; allowed [0], threads 1 -> None.
    """
    count = max(1, threads or 1)
    if len(allowed) <= count:
        return None
    return frozenset(allowed[:count])


def bind_current_thread(cores: frozenset[int] | None) -> None:
    """Restrict the calling thread (not the whole process) to `cores`; None: no change."""
    if cores is not None:
        os.sched_setaffinity(0, cores)  # pid 0 on Linux: the calling thread only


def _allowed_cores(spec: str) -> set[int]:
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        raise ValueError(f"--cpu-bind {spec!r}: this platform cannot bind threads to cores; "
                         f"use --cpu-bind none")
    return set(os.sched_getaffinity(0))


def _parse_list(spec: str) -> set[int]:
    """"0,2-3" -> {0, 2, 3}; ValueError naming `spec` when malformed or empty."""
    cores: set[int] = set()
    try:
        for part in spec.split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high or low)
            if first < 0 or last < first:
                raise ValueError(part)
            cores.update(range(first, last + 1))
    except ValueError:
        raise ValueError(f"--cpu-bind {spec!r}: expected none, auto or a list of cores "
                         f"such as 0 or 0,2-3") from None
    return cores
