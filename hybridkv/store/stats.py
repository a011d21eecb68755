"""Counters of a KV tier: what was read back, written, rejected, and how long it took."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hybridkv.store.base import StoreStats


@dataclass
class GroupTierStats:
    """Per KV cache group, cumulative."""

    loaded_blocks: int = 0  # blocks read from the store into the pool
    loaded_tokens: int = 0  # tokens those blocks cover (a Mamba state: its block's)
    read_bytes: int = 0
    written_blocks: int = 0  # blocks the store took
    written_bytes: int = 0
    rejected_blocks: int = 0  # damaged or mismatched payloads (recomputed)
    load_seconds: float = 0.0  # reading, checking and copying in this group's blocks
    store_seconds: float = 0.0  # encoding and writing them


@dataclass
class KVStoreStats:
    """What `LLM.kv_store_stats()` returns: a snapshot, cumulative since start.

    `hit_tokens`: prompt tokens reused because of the store (beyond what
    the device pool alone held), also on `RequestOutput` as
    `num_external_cached_tokens`. `load_seconds` is time spent on the
    engine's thread reading and copying blocks in (`load_cpu_seconds` its CPU
    time, which other processes on the machine do not inflate); `store_seconds` the
    time encoding and putting them (the background writer's, or the engine's for
    the few blocks a cpu store takes inline). `errors`: failed
    store calls; `skipped_calls`: calls not tried while the store was
    unavailable; `dropped_blocks`: blocks to write that were not (writer
    backlog full, too many requests awaited). With `shared_writes` (blocks
    written at compute time for other instances) `skipped_blocks` counts
    blocks not written again: this instance wrote them before, or the store
    held them already.
    """

    url: str
    available: bool = True
    lookups: int = 0  # admissions that asked the store
    queried_tokens: int = 0  # the tokens of those requests
    hit_requests: int = 0
    hit_tokens: int = 0
    loaded_blocks: int = 0
    read_bytes: int = 0
    written_blocks: int = 0
    written_bytes: int = 0
    rejected_blocks: int = 0
    dropped_blocks: int = 0
    skipped_blocks: int = 0
    shared_writes: bool = False
    load_seconds: float = 0.0
    load_cpu_seconds: float = 0.0  # the engine thread's CPU time of those loads
    store_seconds: float = 0.0
    errors: int = 0
    skipped_calls: int = 0
    groups: list[GroupTierStats] = field(default_factory=list)
    store: StoreStats | None = None

    def snapshot(self) -> KVStoreStats:
        return copy.deepcopy(self)
