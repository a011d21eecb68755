"""Prometheus metrics of one server (`GET /metrics`), on its own registry.

vLLM's names where vLLM has the figure (dashboards and routers read them),
`hybridkv_` names for the rest. Every metric carries `model_name`; per-group
figures also `group` (the KV cache group id of `/v1/kv_cache_layout`).
Counters appear with the `_total` suffix prometheus-client adds.

`vllm:prefix_cache_queries` and `_hits` count a request once, when it is admitted,
as vLLM does (a request re-admitted after a preemption is not counted again): a
request waiting for room is looked up at every step, and counting those lookups
would weigh the requests that wait longest, the misses, several times. The
`hybridkv_` per-group and stranded counters count every lookup.

| metric | type | meaning |
| --- | --- | --- |
| vllm:num_requests_running | gauge | requests in the running batch |
| vllm:num_requests_waiting | gauge | requests queued for admission (incl. preempted) |
| vllm:kv_cache_usage_perc | gauge | fraction of usable blocks held (0-1) |
| vllm:prefix_cache_queries | counter | prompt tokens of requests admitted (each once) |
| vllm:prefix_cache_hits | counter | of those, tokens reused from the pool at admission |
| vllm:num_preemptions | counter | requests preempted (recomputed later) |
| vllm:prompt_tokens | counter | prompt tokens of admitted requests |
| vllm:generation_tokens | counter | output tokens sampled |
| vllm:request_success | counter | finished requests, label finished_reason (stop/length/abort) |
| vllm:time_to_first_token_seconds | histogram | arrival to first output token |
| vllm:inter_token_latency_seconds | histogram | time between output tokens of a request |
| vllm:e2e_request_latency_seconds | histogram | arrival to finish |
| hybridkv_prefix_cache_group_queries | counter | per group: prompt tokens of every lookup |
| hybridkv_prefix_cache_group_hits | counter | per group: tokens that group alone could reuse |
| hybridkv_prefix_cache_stranded_tokens | counter | tokens cached in full attention but unusable |
| hybridkv_kv_cache_group_evictions | counter | per group: cached blocks recycled |
| hybridkv_kv_cache_group_info | gauge | 1 per group, labels type and block_size |
| hybridkv_kv_cache_blocks_held | gauge | blocks held by requests (0 when idle) |
| hybridkv_kv_cache_blocks | gauge | usable blocks in the pool |
| hybridkv_requests_rejected | counter | requests refused with 429 (queue full) |
| hybridkv_events_published | counter | block event batches written to --events |
| hybridkv_events_dropped | counter | batches dropped (publisher queue full) |

With `--kv-store` (docs/kv_tiers.md), also:

| metric | type | meaning |
| --- | --- | --- |
| vllm:external_prefix_cache_queries | counter | prompt tokens of requests the store was asked for |
| vllm:external_prefix_cache_hits | counter | prompt tokens reused because the store held them |
| hybridkv_kv_store_hit_tokens | counter | per group: tokens covered by blocks loaded |
| hybridkv_kv_store_loaded_blocks | counter | per group: blocks loaded from the store |
| hybridkv_kv_store_read_bytes | counter | per group: bytes of block data loaded |
| hybridkv_kv_store_written_blocks | counter | per group: blocks written to the store |
| hybridkv_kv_store_written_bytes | counter | per group: bytes written (headers included) |
| hybridkv_kv_store_rejected_blocks | counter | per group: damaged or mismatched blocks |
| hybridkv_kv_store_load_seconds | counter | per group: time reading, checking, copying blocks in |
| hybridkv_kv_store_store_seconds | counter | per group: time encoding and writing blocks |
| hybridkv_kv_store_dropped_blocks | counter | evicted blocks not written (writer backlog full) |
| hybridkv_kv_store_errors | counter | failed store calls (each a recompute, never an error) |
| hybridkv_kv_store_up | gauge | 1 while the store answers, 0 while it is backed off |
| hybridkv_kv_store_keys | gauge | blocks the store holds (as it counts them) |
| hybridkv_kv_store_used_bytes | gauge | bytes the store holds (as it counts them) |

The store figures are read when `/metrics` is scraped.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from hybridkv.serving.layout import group_type
from hybridkv.serving.store_metrics import StoreMetrics

TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
               0.075, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
               30.0, 40.0, 50.0, 60.0, 120.0, 240.0)


class ServerMetrics:
    """The server's metrics; `record_*` may be called from any thread."""

    def __init__(self, model_name: str, llm: Any) -> None:
        disable_created_metrics()  # as vLLM: no *_created series
        self.registry = CollectorRegistry()
        self._m = {"model_name": model_name}
        self.num_groups = len(llm.config.kv_cache_groups)
        self._build_engine_metrics()
        self._build_request_metrics()
        self._build_group_metrics(llm)
        self.store = StoreMetrics(self, llm.tier) if getattr(llm, "tier", None) else None
        stats, sched = llm.kv.prefix_cache_stats, llm.scheduler.stats
        # counters start from the engine's state now (a warm-up run is not counted)
        self._last = {"lookups": stats.queries, "queries": sched.prompt_tokens,
                      "hits": sched.cached_tokens - sched.external_cached_tokens,
                      "stranded": stats.stranded_tokens, "preemptions": sched.preemptions,
                      "prompt_tokens": sched.prompt_tokens, "group_hits": list(stats.group_hits),
                      "group_evictions": list(stats.group_evictions)}

    def _gauge(self, name: str, doc: str) -> Any:
        """A gauge with only the model_name label, bound to it."""
        return Gauge(name, doc, ("model_name",), registry=self.registry).labels(**self._m)

    def _counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, ("model_name",), registry=self.registry).labels(**self._m)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Any:
        return Histogram(name, doc, ("model_name",), buckets=buckets,
                         registry=self.registry).labels(**self._m)

    def _per_group(self, name: str, doc: str) -> list[Any]:
        """A counter with labels model_name and group, one bound child per group."""
        metric = Counter(name, doc, ("model_name", "group"), registry=self.registry)
        return [metric.labels(group=str(g), **self._m) for g in range(self.num_groups)]

    def counter(self, name: str, doc: str) -> Any:
        return self._counter(name, doc)

    def gauge(self, name: str, doc: str) -> Any:
        return self._gauge(name, doc)

    def per_group(self, name: str, doc: str) -> list[Any]:
        return self._per_group(name, doc)

    def _build_engine_metrics(self) -> None:
        self.running = self._gauge("vllm:num_requests_running", "Requests running.")
        self.waiting = self._gauge("vllm:num_requests_waiting", "Requests waiting.")
        self.usage = self._gauge("vllm:kv_cache_usage_perc",
                                 "Fraction of usable KV cache blocks held (0-1).")
        self.queries = self._counter("vllm:prefix_cache_queries",
                                     "Prompt tokens of requests admitted.")
        self.hits = self._counter("vllm:prefix_cache_hits",
                                  "Prompt tokens reused from the prefix cache at admission.")
        self.preemptions = self._counter("vllm:num_preemptions", "Preempted requests.")
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Prompt tokens admitted.")
        self.blocks_held = self._gauge("hybridkv_kv_cache_blocks_held",
                                       "KV cache blocks held by requests.")
        self.blocks = self._gauge("hybridkv_kv_cache_blocks", "Usable KV cache blocks.")
        self.stranded = self._counter("hybridkv_prefix_cache_stranded_tokens",
                                      "Tokens cached in full attention but unusable "
                                      "because another group missed.")

    def _build_request_metrics(self) -> None:
        self.generation_tokens = self._counter("vllm:generation_tokens", "Output tokens.")
        success = Counter("vllm:request_success", "Finished requests.",
                          ("model_name", "finished_reason"), registry=self.registry)
        self.success = {reason: success.labels(finished_reason=reason, **self._m)
                        for reason in ("stop", "length", "abort")}
        self.ttft = self._histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                                    TTFT_BUCKETS)
        self.itl = self._histogram("vllm:inter_token_latency_seconds", "Inter-token latency.",
                                   ITL_BUCKETS)
        self.e2e = self._histogram("vllm:e2e_request_latency_seconds", "End-to-end latency.",
                                   E2E_BUCKETS)
        self.rejected = self._counter("hybridkv_requests_rejected",
                                      "Requests refused because the queue was full.")
        self.events_published = self._counter("hybridkv_events_published",
                                              "Block event batches published.")
        self.events_dropped = self._counter("hybridkv_events_dropped",
                                            "Block event batches dropped (queue full).")

    def _build_group_metrics(self, llm: Any) -> None:
        self.group_queries = self._per_group("hybridkv_prefix_cache_group_queries",
                                             "Prompt tokens looked up, per group.")
        self.group_hits = self._per_group("hybridkv_prefix_cache_group_hits",
                                          "Tokens each group alone could reuse.")
        self.group_evictions = self._per_group("hybridkv_kv_cache_group_evictions",
                                               "Cached blocks recycled, per group.")
        info = Gauge("hybridkv_kv_cache_group_info", "KV cache groups (value 1).",
                     ("model_name", "group", "type", "block_size"), registry=self.registry)
        for gid, g in enumerate(llm.config.kv_cache_groups):
            spec = g.kv_cache_spec
            info.labels(group=str(gid), type=group_type(spec), block_size=str(spec.block_size),
                        **self._m).set(1)
        self.blocks.set(llm.config.num_blocks - 1)

    # ---- updates -------------------------------------------------------------

    def record_engine(self, llm: Any) -> None:
        """Gauges and counters from the engine's state (call on the engine thread)."""
        last = self._last
        sched, pool = llm.scheduler, llm.kv.pool
        self.running.set(len(sched.running))
        self.waiting.set(len(sched.waiting))
        self.usage.set(pool.usage)
        self.blocks_held.set(pool.num_blocks - 1 - pool.num_free_blocks - pool.num_pinned)
        stats = llm.kv.prefix_cache_stats
        self._record_groups(stats.queries - last["lookups"], stats)
        last["lookups"] = stats.queries
        admitted = sched.stats
        for key, value, metric in (("queries", admitted.prompt_tokens, self.queries),
                                   ("hits", admitted.cached_tokens
                                    - admitted.external_cached_tokens, self.hits),
                                   ("stranded", stats.stranded_tokens, self.stranded),
                                   ("preemptions", sched.stats.preemptions, self.preemptions),
                                   ("prompt_tokens", sched.stats.prompt_tokens,
                                    self.prompt_tokens)):
            if value != last[key]:
                metric.inc(value - last[key])
                last[key] = value

    def _record_groups(self, new_queries: int, stats: Any) -> None:
        """Per-group counters: every group is asked about every queried token."""
        last = self._last
        for gid in range(self.num_groups):
            if new_queries:
                self.group_queries[gid].inc(new_queries)
            for key, values, metric in (("group_hits", stats.group_hits, self.group_hits),
                                        ("group_evictions", stats.group_evictions,
                                         self.group_evictions)):
                if values[gid] != last[key][gid]:
                    metric[gid].inc(values[gid] - last[key][gid])
                    last[key][gid] = values[gid]

    def record_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def record_tokens(self, num_tokens: int, inter_token_seconds: float | None) -> None:
        self.generation_tokens.inc(num_tokens)
        if inter_token_seconds is not None:
            self.itl.observe(inter_token_seconds)

    def record_finish(self, reason: str, seconds: float) -> None:
        self.success[reason].inc()
        self.e2e.observe(seconds)

    def record_rejected(self) -> None:
        self.rejected.inc()

    def record_events(self, published: int = 0, dropped: int = 0) -> None:
        if published:
            self.events_published.inc(published)
        if dropped:
            self.events_dropped.inc(dropped)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        if self.store is not None:
            self.store.record()
        return generate_latest(self.registry)
