"""The router's `/metrics` (Prometheus text), per backend.

| name | type | meaning |
| --- | --- | --- |
| hybridkv_router_requests_total | counter | requests answered, labels backend, status |
| hybridkv_router_routed_total | counter | requests routed (retries count again), label backend |
| hybridkv_router_routed_cached_tokens_total | counter | prompt tokens the policy expected |
|   | | the backend to reuse |
| hybridkv_router_routed_store_tokens_total | counter | of those, tokens only the shared |
|   | | KV store held (`--kv-store`) |
| hybridkv_router_retries_total | counter | requests sent again after their backend failed |
| hybridkv_router_backend_healthy | gauge | 1 in rotation, 0 out |
| hybridkv_router_backend_up | gauge | 1 when the last health check of the URL passed (label |
|   | | url: also for a backend that never became healthy) |
| hybridkv_router_backend_checks_failed | gauge | health checks failed in a row, label url |
| hybridkv_router_stream_failures_total | counter | streams whose backend failed mid-way |
|   | | (also counted in requests_total with status "stream_failed") |
| hybridkv_router_in_flight | gauge | requests this router has sent and not seen finish |
| hybridkv_router_pending_tokens | gauge | their prompt tokens not yet computed (estimate) |
| hybridkv_router_backend_waiting / _running | gauge | the backend's own queue and batch (polled) |
| hybridkv_router_cached_blocks | gauge | group blocks the backend caches, as its events tell |
| hybridkv_router_store_queries_total / _errors_total | counter | shared KV store queries, |
|   | | and the ones that failed |
| hybridkv_router_event_read_failures_total | counter | block event reads that failed (retried) |
| hybridkv_router_event_rebuilds_total | counter | views rebuilt because a stream lost entries |
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, GCCollector, generate_latest

from hybridkv.serving.router.routing import Decision, Router


class RouterMetrics:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.backends: Any = None  # set by the app: Backends, for health and URLs
        self.registry = r = CollectorRegistry()
        GCCollector(registry=r)  # python_gc_collections_total{generation}: pauses of the loop
        self.requests = Counter("hybridkv_router_requests", "Requests answered.",
                                ("backend", "status"), registry=r)
        self.routed_count = Counter("hybridkv_router_routed", "Requests routed.", ("backend",),
                                    registry=r)
        self.cached = Counter("hybridkv_router_routed_cached_tokens",
                              "Prompt tokens the policy expected the backend to reuse.",
                              ("backend",), registry=r)
        self.from_store = Counter("hybridkv_router_routed_store_tokens",
                                  "Of the expected reused tokens, those only the shared KV "
                                  "store held.", ("backend",), registry=r)
        self.store: Any = None  # set by the app: StoreView, for its query counts
        self.store_queries = Counter("hybridkv_router_store_queries",
                                     "Queries of the shared KV store.", registry=r)
        self.store_errors = Counter("hybridkv_router_store_errors",
                                    "Queries of the shared KV store that failed.", registry=r)
        self._store_counts = (0, 0)
        self.streams: Any = None  # set by the app: EventStreams, for its counts
        self.read_failures = Counter("hybridkv_router_event_read_failures",
                                     "Block event reads that failed (and were retried).",
                                     registry=r)
        self.rebuilds = Counter("hybridkv_router_event_rebuilds",
                                "Cache views rebuilt because a stream lost entries.", registry=r)
        self._stream_counts = (0, 0)
        self.retries = Counter("hybridkv_router_retries",
                               "Requests sent again after their backend failed.", registry=r)
        self.healthy = Gauge("hybridkv_router_backend_healthy", "1 in rotation, 0 out.",
                             ("backend",), registry=r)
        self.up = Gauge("hybridkv_router_backend_up", "1 when the last health check passed.",
                        ("url",), registry=r)
        self.checks_failed = Gauge("hybridkv_router_backend_checks_failed",
                                   "Health checks failed in a row.", ("url",), registry=r)
        self.stream_failures = Counter("hybridkv_router_stream_failures",
                                       "Streams whose backend failed mid-way.", ("backend",),
                                       registry=r)
        self.in_flight = Gauge("hybridkv_router_in_flight", "Requests in flight.",
                               ("backend",), registry=r)
        self.pending = Gauge("hybridkv_router_pending_tokens",
                             "Prompt tokens sent and not yet computed (estimate).",
                             ("backend",), registry=r)
        self.waiting = Gauge("hybridkv_router_backend_waiting", "The backend's waiting requests.",
                             ("backend",), registry=r)
        self.running = Gauge("hybridkv_router_backend_running", "The backend's running requests.",
                             ("backend",), registry=r)
        self.blocks = Gauge("hybridkv_router_cached_blocks",
                            "Group blocks the backend caches, from its events.", ("backend",),
                            registry=r)

    def routed(self, decision: Decision) -> None:
        self.routed_count.labels(decision.instance_id).inc()
        self.cached.labels(decision.instance_id).inc(decision.cached_tokens)
        self.from_store.labels(decision.instance_id).inc(decision.store_tokens)

    def answered(self, decision: Decision, status: int | str) -> None:
        self.requests.labels(decision.instance_id, str(status)).inc()

    def stream_failed(self, decision: Decision) -> None:
        self.stream_failures.labels(decision.instance_id).inc()
        self.answered(decision, "stream_failed")

    def render(self) -> bytes:
        for instance_id, backend in self.router.backends.items():
            load = self.router.loads[instance_id]
            self.healthy.labels(instance_id).set(int(backend.healthy))
            self.in_flight.labels(instance_id).set(load.in_flight)
            self.pending.labels(instance_id).set(load.pending_tokens)
            self.waiting.labels(instance_id).set(load.waiting)
            self.running.labels(instance_id).set(load.running)
            self.blocks.labels(instance_id).set(backend.index.num_cached_blocks(instance_id))
        for state in getattr(self.backends, "by_url", {}).values():
            self.up.labels(state.url).set(int(state.healthy))
            self.checks_failed.labels(state.url).set(state.checks_failed)
        if self.store is not None:  # the view counts; the counters catch up
            queries, errors = self.store.num_queries, self.store.num_errors
            self.store_queries.inc(queries - self._store_counts[0])
            self.store_errors.inc(errors - self._store_counts[1])
            self._store_counts = (queries, errors)
        if self.streams is not None:
            failures, rebuilds = self.streams.num_failures, self.streams.num_rebuilds
            self.read_failures.inc(failures - self._stream_counts[0])
            self.rebuilds.inc(rebuilds - self._stream_counts[1])
            self._stream_counts = (failures, rebuilds)
        return generate_latest(self.registry)
