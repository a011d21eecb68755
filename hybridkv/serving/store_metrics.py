"""The KV store's metrics of a server (`--kv-store`): tier stats as Prometheus series.

Names and meanings are listed in `hybridkv.serving.metrics` (and
docs/serving.md). Counters follow the tier's cumulative stats
(`KVTier.stats()`): each scrape adds what they grew by since the last one.
"""

from __future__ import annotations

import threading
from typing import Any

# per-group counters: metric name, help, the GroupTierStats field
_GROUP_COUNTERS = (
    ("hybridkv_kv_store_hit_tokens", "Tokens covered by blocks loaded from the KV store.",
     "loaded_tokens"),
    ("hybridkv_kv_store_loaded_blocks", "Blocks loaded from the KV store.", "loaded_blocks"),
    ("hybridkv_kv_store_read_bytes", "Bytes of block data loaded from the KV store.",
     "read_bytes"),
    ("hybridkv_kv_store_written_blocks", "Blocks written to the KV store.", "written_blocks"),
    ("hybridkv_kv_store_written_bytes", "Bytes written to the KV store.", "written_bytes"),
    ("hybridkv_kv_store_rejected_blocks", "Damaged or mismatched blocks rejected (recomputed).",
     "rejected_blocks"),
    ("hybridkv_kv_store_load_seconds", "Time reading, checking and copying blocks in.",
     "load_seconds"),
    ("hybridkv_kv_store_store_seconds", "Time encoding and writing blocks to the KV store.",
     "store_seconds"),
)
# counters of the whole tier: metric name, help, the KVStoreStats field
_COUNTERS = (
    ("vllm:external_prefix_cache_queries", "Prompt tokens looked up in the KV store.",
     "queried_tokens"),
    ("vllm:external_prefix_cache_hits", "Prompt tokens reused because the KV store held them.",
     "hit_tokens"),
    ("hybridkv_kv_store_dropped_blocks", "Evicted blocks not written (writer backlog full).",
     "dropped_blocks"),
    ("hybridkv_kv_store_errors", "Failed KV store calls.", "errors"),
)


class StoreMetrics:
    """The store series of `metrics` (a ServerMetrics) for `tier` (a KVTier)."""

    def __init__(self, metrics: Any, tier: Any) -> None:
        self.tier = tier
        self._lock = threading.Lock()  # scrapes may overlap
        self._groups = {field: metrics.per_group(name, doc) for name, doc, field in _GROUP_COUNTERS}
        self._totals = {field: metrics.counter(name, doc) for name, doc, field in _COUNTERS}
        self.up = metrics.gauge("hybridkv_kv_store_up", "1 while the KV store answers.")
        self.keys = metrics.gauge("hybridkv_kv_store_keys", "Blocks the KV store holds.")
        self.used = metrics.gauge("hybridkv_kv_store_used_bytes", "Bytes the KV store holds.")
        stats = tier.stats()  # counters start from the tier's state now
        self._last = {field: getattr(stats, field) for field in self._totals}
        self._last_groups = {field: [getattr(g, field) for g in stats.groups]
                             for field in self._groups}
        self.record()

    def record(self) -> None:
        """Bring the series up to the tier's stats now."""
        with self._lock:
            stats = self.tier.stats()
            for field, metric in self._totals.items():
                self._add(metric, getattr(stats, field), self._last, field)
            for field, metrics in self._groups.items():
                last = self._last_groups[field]
                for g, (metric, group) in enumerate(zip(metrics, stats.groups)):
                    value = getattr(group, field)
                    if value > last[g]:
                        metric.inc(value - last[g])
                        last[g] = value
            self.up.set(1 if stats.available else 0)
            if stats.store is not None:
                self.keys.set(stats.store.keys)
                self.used.set(stats.store.used_bytes)

    @staticmethod
    def _add(metric: Any, value: float, last: dict, field: str) -> None:
        if value > last[field]:
            metric.inc(value - last[field])
            last[field] = value
