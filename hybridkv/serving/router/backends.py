"""The router's backends: health checks, load polling, layouts.

Every `interval` seconds each backend gets `GET /health` and `GET /metrics`.
A backend that fails a check (no answer within the timeout, or not 200)
leaves rotation at once; it returns when a check passes again. Its layout
(`GET /v1/kv_cache_layout`) is read when it first answers, and again after it
was down (a restarted backend may come back with another instance id); the
instance id there names its event stream. A backend named in
`--kv-event-source` (vLLM, or hybridkv with `--kv-events-config`) has no
such layout: its instance id is its URL, its model the first of
`/v1/models`, and its layout is learned from its events (`vllm_view`).
From /metrics the router reads
`vllm:num_requests_waiting` and `vllm:num_requests_running` (its own count of
requests in flight is kept by `Router`). A backend that has never passed a
check is logged at its first failure and again at the 10th, 100th, ...
(`hybridkv_router_backend_up` / `_checks_failed` in the router's /metrics).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hybridkv.kv_cache.specs import FullAttentionSpec
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.routing import Router

logger = logging.getLogger("hybridkv.router")


@dataclass
class BackendState:
    url: str
    instance_id: str | None = None  # from its layout, once read
    model: str | None = None
    healthy: bool = False
    checks_failed: int = 0
    ever_healthy: bool = False
    layout: dict[str, Any] | None = None  # its last layout JSON
    zmq_events: bool = False  # its layout and blocks come from vLLM-format events


def load_from_metrics(text: str) -> tuple[int, int]:
    """(waiting, running) from a backend's Prometheus text (0 when absent)."""
    values = {"vllm:num_requests_waiting": 0.0, "vllm:num_requests_running": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
    return int(values["vllm:num_requests_waiting"]), int(values["vllm:num_requests_running"])


class Backends:
    """All backends by URL, kept in step with `router` (rotation, layouts, loads)."""

    def __init__(self, urls: list[str], router: Router, client: httpx.AsyncClient, *,
                 interval: float = 1.0, timeout: float = 2.0, on_layout=None,
                 zmq_urls: frozenset[str] = frozenset()) -> None:
        if not urls:
            raise ValueError("the router needs at least one --backend URL")
        self.by_url = {u.rstrip("/"): BackendState(u.rstrip("/"),
                                                   zmq_events=u.rstrip("/") in zmq_urls)
                       for u in urls}
        self.router = router
        self.client = client
        self.interval = interval
        self.timeout = timeout
        self.on_layout = on_layout or (lambda state: None)  # a backend (re)joined

    def by_instance(self, instance_id: str) -> BackendState:
        return next(b for b in self.by_url.values() if b.instance_id == instance_id)

    def healthy(self) -> list[BackendState]:
        return [b for b in self.by_url.values() if b.healthy]

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(b) for b in self.by_url.values()))

    async def run(self) -> None:
        """Check every backend every `interval` seconds, forever."""
        while True:
            await self.check_all()
            await asyncio.sleep(self.interval)

    async def check(self, backend: BackendState) -> None:
        try:
            health = await self.client.get(f"{backend.url}/health", timeout=self.timeout)
            if health.status_code != 200:
                raise httpx.HTTPStatusError("unhealthy", request=health.request,
                                            response=health)
            if backend.zmq_events and backend.instance_id is None:
                await self._join_by_url(backend)
            elif not backend.healthy or backend.instance_id is None:
                await self._read_layout(backend)
            metrics = await self.client.get(f"{backend.url}/metrics", timeout=self.timeout)
            waiting, running = load_from_metrics(metrics.text)
        except (httpx.HTTPError, ValueError, KeyError) as err:
            self.mark_down(backend, f"{type(err).__name__}: {err}")
            return
        if backend.instance_id in self.router.loads:
            self.router.update_load(backend.instance_id, waiting=waiting, running=running)
        if not backend.healthy:
            logger.info("backend %s (%s) is healthy", backend.url, backend.instance_id)
        backend.healthy, backend.checks_failed, backend.ever_healthy = True, 0, True
        self.router.set_healthy(backend.instance_id, True)  # type: ignore[arg-type]

    async def _read_layout(self, backend: BackendState) -> None:
        response = await self.client.get(f"{backend.url}/v1/kv_cache_layout",
                                         timeout=self.timeout)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        layout = CacheLayout.from_json(body)
        instance_id = str(body.get("instance_id") or backend.url)
        if backend.instance_id is not None and backend.instance_id != instance_id:
            self.router.remove_backend(backend.instance_id)
        backend.instance_id, backend.model = instance_id, body.get("model")
        backend.layout = body
        self.router.add_backend(instance_id, layout, backend.model)
        self.on_layout(backend)

    async def _join_by_url(self, backend: BackendState) -> None:
        """A backend followed through its ZMQ events: id = URL, and until its
        events name its groups, one full-attention group (no reuse credited)."""
        response = await self.client.get(f"{backend.url}/v1/models", timeout=self.timeout)
        response.raise_for_status()
        models = response.json().get("data") or []
        backend.instance_id = backend.url
        backend.model = models[0].get("id") if models else None
        if backend.url not in self.router.backends:
            self.router.add_backend(backend.url, CacheLayout((FullAttentionSpec(16),)),
                                    backend.model)
        self.on_layout(backend)

    def mark_down(self, backend: BackendState, why: str) -> None:
        """Take the backend out of rotation (a failed check or a failed request)."""
        backend.checks_failed += 1
        if backend.healthy:
            logger.warning("backend %s (%s) left rotation: %s", backend.url,
                           backend.instance_id, why)
        elif not backend.ever_healthy and _is_power_of_ten(backend.checks_failed):
            logger.warning("backend %s has not become healthy (%d checks failed): %s",
                           backend.url, backend.checks_failed, why)
        backend.healthy = False
        if backend.instance_id is not None and backend.instance_id in self.router.backends:
            self.router.set_healthy(backend.instance_id, False)


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0 and n > 1:
        n //= 10
    return n == 1
