"""Prometheus metrics of the semantic cache, on the server's (or router's)
registry: hits (exact / similar), misses, lookup latency, entries,
evictions, verifications and verified false hits."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1.0)


class SemanticMetrics:
    """Counters named `hybridkv:semantic_cache_*`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        p = "hybridkv:semantic_cache_"
        self.hits = Counter(p + "hits", "requests answered from the cache", ("kind",),
                            registry=r)
        self.misses = Counter(p + "misses", "looked-up requests the model answered",
                              registry=r)
        self.latency = Histogram(p + "lookup_seconds", "embedding + search + fetch time",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.entries = Gauge(p + "entries", "entries this instance can find", registry=r)
        self.evictions = Counter(p + "evictions", "entries removed for room or age",
                                 registry=r)
        self.verifications = Counter(p + "verifications",
                                     "candidate hits checked by running the model", registry=r)
        self.false_hits = Counter(p + "verified_false_hits",
                                  "verified candidates whose answer differed", registry=r)
        self.errors = Counter(p + "store_errors", "failed calls to the entry store",
                              registry=r)
        self._seen: dict[str, int] = {"evictions": 0, "errors": 0}

    def track(self, store: Any) -> None:
        """Bring the store's own counts (entries, evictions, errors) up to date."""
        self.entries.set(len(store))
        self._bump("evictions", self.evictions, store.num_evictions)
        self._bump("errors", self.errors, getattr(store, "num_errors", 0))

    def _bump(self, name: str, counter: Any, total: int) -> None:
        if total > self._seen[name]:
            counter.inc(total - self._seen[name])
            self._seen[name] = total
