"""The router's `/metrics` (Prometheus text), per backend.

| name | type | meaning |
| --- | --- | --- |
| hybridkv_router_requests_total | counter | requests answered, labels backend, status |
| hybridkv_router_routed_total | counter | requests routed (retries count again), label backend |
| hybridkv_router_routed_cached_tokens_total | counter | prompt tokens the policy expected |
|   | | the backend to reuse |
| hybridkv_router_retries_total | counter | requests sent again after their backend failed |
| hybridkv_router_backend_healthy | gauge | 1 in rotation, 0 out |
| hybridkv_router_in_flight | gauge | requests this router has sent and not seen finish |
| hybridkv_router_pending_tokens | gauge | their prompt tokens not yet computed (estimate) |
| hybridkv_router_backend_waiting / _running | gauge | the backend's own queue and batch (polled) |
| hybridkv_router_cached_blocks | gauge | group blocks the backend caches, as its events tell |
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from hybridkv.serving.router.routing import Decision, Router


class RouterMetrics:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.backends: Any = None  # set by the app: Backends, for health and URLs
        self.registry = r = CollectorRegistry()
        self.requests = Counter("hybridkv_router_requests", "Requests answered.",
                                ("backend", "status"), registry=r)
        self.routed_count = Counter("hybridkv_router_routed", "Requests routed.", ("backend",),
                                    registry=r)
        self.cached = Counter("hybridkv_router_routed_cached_tokens",
                              "Prompt tokens the policy expected the backend to reuse.",
                              ("backend",), registry=r)
        self.retries = Counter("hybridkv_router_retries",
                               "Requests sent again after their backend failed.", registry=r)
        self.healthy = Gauge("hybridkv_router_backend_healthy", "1 in rotation, 0 out.",
                             ("backend",), registry=r)
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

    def answered(self, decision: Decision, status: int) -> None:
        self.requests.labels(decision.instance_id, str(status)).inc()

    def render(self) -> bytes:
        for instance_id, backend in self.router.backends.items():
            load = self.router.loads[instance_id]
            self.healthy.labels(instance_id).set(int(backend.healthy))
            self.in_flight.labels(instance_id).set(load.in_flight)
            self.pending.labels(instance_id).set(load.pending_tokens)
            self.waiting.labels(instance_id).set(load.waiting)
            self.running.labels(instance_id).set(load.running)
            self.blocks.labels(instance_id).set(backend.index.num_cached_blocks(instance_id))
        return generate_latest(self.registry)
