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
import json
import logging
from dataclasses import dataclass
from typing import Any

from hybridkv.kv_cache.specs import FullAttentionSpec
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.routing import Router
from hybridkv.serving.router.upstream import UpstreamError, UpstreamPool

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


LOAD_PREFIX = "vllm:num_requests_"


def load_from_metrics(text: str) -> tuple[int, int]:
    """(waiting, running) from a backend's Prometheus text (0 when absent), summed
    over label sets. Only the lines of these two samples are parsed:
    `vllm:num_requests_waiting{model_name="m"} 3.0` -> 3 waiting."""
    values = {"vllm:num_requests_waiting": 0.0, "vllm:num_requests_running": 0.0}
    for line in text.splitlines():
        if line.startswith(LOAD_PREFIX):
            name, value = _sample(line)
            if name in values:
                values[name] += value
    return int(values["vllm:num_requests_waiting"]), int(values["vllm:num_requests_running"])


def _sample(line: str) -> tuple[str, float]:
    """`name{labels} value [timestamp]` -> (name, value); ValueError if malformed."""
    brace = line.find("{")
    if brace >= 0:  # a label value may hold spaces and braces: the set ends at the last }
        return line[:brace], float(line[line.rindex("}") + 1:].split()[0])
    name, value = line.split()[:2]
    return name, float(value)


class BackendDown(Exception):
    """A check's answer shows the backend cannot serve."""


class Backends:
    """All backends by URL, kept in step with `router` (rotation, layouts, loads)."""

    def __init__(self, urls: list[str], router: Router, *, interval: float = 1.0,
                 timeout: float = 2.0, on_layout=None, zmq_urls: frozenset[str] = frozenset(),
                 headers: list[tuple[str, str]] | None = None) -> None:
        if not urls:
            raise ValueError("the router needs at least one --backend URL")
        self.by_url = {u.rstrip("/"): BackendState(u.rstrip("/"),
                                                   zmq_events=u.rstrip("/") in zmq_urls)
                       for u in urls}
        self.router = router
        self.pool = UpstreamPool(read_timeout=timeout, connect_timeout=timeout)
        self.headers = headers or []  # sent with every check (the backend API key)
        self.interval = interval
        self.timeout = timeout
        self.on_layout = on_layout or (lambda state: None)  # a backend (re)joined

    def by_instance(self, instance_id: str) -> BackendState:
        return next(b for b in self.by_url.values() if b.instance_id == instance_id)

    def healthy(self) -> list[BackendState]:
        return [b for b in self.by_url.values() if b.healthy]

    async def close(self) -> None:
        await self.pool.close()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(b) for b in self.by_url.values()))

    async def run(self) -> None:
        """Check every backend every `interval` seconds, forever."""
        while True:
            await self.check_all()
            await asyncio.sleep(self.interval)

    async def get(self, url: str) -> bytes:
        """The body of `GET url`; BackendDown unless it answers 200 within the timeout."""
        try:
            reply = await self.pool.request("GET", url, self.headers)
            body = await reply.read()
        except UpstreamError as err:
            raise BackendDown(str(err)) from None
        if reply.status != 200:
            raise BackendDown(f"GET {url} answered {reply.status}")
        return body

    async def check(self, backend: BackendState) -> None:
        try:
            await self.get(f"{backend.url}/health")
            if backend.zmq_events and backend.instance_id is None:
                await self._join_by_url(backend)
            elif not backend.healthy or backend.instance_id is None:
                await self._read_layout(backend)
            metrics = await self.get(f"{backend.url}/metrics")
            waiting, running = load_from_metrics(metrics.decode("utf-8", "replace"))
        except (BackendDown, ValueError, KeyError, AttributeError) as err:
            self.mark_down(backend, f"{type(err).__name__}: {err}")
            return
        if backend.instance_id in self.router.loads:
            self.router.update_load(backend.instance_id, waiting=waiting, running=running)
        if not backend.healthy:
            logger.info("backend %s (%s) is healthy", backend.url, backend.instance_id)
        backend.healthy, backend.checks_failed, backend.ever_healthy = True, 0, True
        self.router.set_healthy(backend.instance_id, True)  # type: ignore[arg-type]

    async def _read_layout(self, backend: BackendState) -> None:
        body: dict[str, Any] = json.loads(await self.get(f"{backend.url}/v1/kv_cache_layout"))
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
        models = json.loads(await self.get(f"{backend.url}/v1/models")).get("data") or []
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
