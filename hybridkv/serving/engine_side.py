"""The engine side of `hybridkv serve`: the LLM the options describe, and what runs
with it (the async engine front, its metrics, the block event publishers).

It runs in the server's process (`--no-engine-process`) or in the engine process of
`engine_process.py`; the HTTP side (`server.py`) is built around it either way.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("hybridkv.serving")


def _kv_cache_bytes(text: str | None) -> int | None:
    from hybridkv.kv_cache.checks import parse_bytes

    return None if text is None else parse_bytes(text, "--kv-cache-bytes")


def build_llm(args: argparse.Namespace) -> Any:
    """The engine the options describe."""
    import torch

    from hybridkv.engine.llm import LLM

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    llm = LLM(args.model, enable_prefix_caching=args.enable_prefix_caching,
               block_size=args.block_size, num_blocks=args.num_blocks,
               kv_cache_memory_bytes=_kv_cache_bytes(args.kv_cache_bytes),
               max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens,
               hash_algo=args.hash_algo, eviction_policy=args.eviction_policy, seed=args.seed,
               kv_store=args.kv_store, prepack_weights=args.prepack_weights)
    warm_up(llm)
    return llm


def warm_up(llm: Any) -> None:
    """One tiny request before serving, so the first client does not pay for the
    first forward's set-up. Shorter than a block: nothing enters the prefix cache."""
    from hybridkv.engine.sampling import SamplingParams

    prompt = list(range(1, max(1, min(4, llm.kv.hash_block_size - 1)) + 1))
    llm.generate([prompt], SamplingParams(max_tokens=2, ignore_eos=True))


def log_startup(llm: Any, args: argparse.Namespace, model_name: str,
                engine_cores: frozenset[int] | None) -> None:
    """The engine's start-up summary (and its thread's cores, when bound) in the log."""
    from hybridkv.serving.summary import startup_summary

    if engine_cores is not None:
        logger.info("engine thread bound to cores %s", sorted(engine_cores))
    own = int(llm.runner.max_model_len)
    context_len = min(args.max_model_len or own, own)
    for line in startup_summary(llm, model_name, context_len,
                                args.eviction_policy).split("\n"):
        logger.info("%s", line)


@dataclass
class EngineSide:
    """What runs with the engine: its async front, metrics, publisher and layout."""

    engine: Any  # AsyncEngine
    metrics: Any  # ServerMetrics
    publisher: Any  # an event publisher, several behind one, or None
    layout: dict[str, Any]
    llm: Any = None  # the LLM, where it runs in this process


def build_engine_side(llm: Any, *, model_name: str, instance_id: str, base_url: str,
                      events_url: str | None = None, kv_events_config: str | None = None,
                      engine_cores: frozenset[int] | None = None,
                      deliver: Any = None) -> EngineSide:
    """The engine front around `llm` (its thread bound to `engine_cores` when given;
    `deliver`: see `AsyncEngine`), its metrics and block event publishers."""
    from hybridkv.serving.async_engine import AsyncEngine
    from hybridkv.serving.event_publisher import EventPublisher
    from hybridkv.serving.layout import kv_cache_layout
    from hybridkv.serving.metrics import ServerMetrics

    layout = kv_cache_layout(llm, model_name, instance_id)
    metrics = ServerMetrics(model_name, llm)
    publisher: Any = None
    if events_url is not None:
        publisher = EventPublisher(events_url, instance_id, {**layout, "url": base_url},
                                   on_published=lambda ok, lost: metrics.record_events(ok, lost))
    publishers = [publisher] if publisher is not None else []
    zmq_publisher = _zmq_publisher(llm, kv_events_config)
    if zmq_publisher is not None:
        publishers.append(zmq_publisher)
    if len(publishers) > 1:
        publisher = Publishers(publishers)
    elif publishers:
        publisher = publishers[0]
    engine = AsyncEngine(llm, metrics=metrics,
                         on_events=publisher.publish if publisher is not None else None,
                         on_add=zmq_publisher.note_request if zmq_publisher else None,
                         cpu_cores=engine_cores, deliver=deliver)
    return EngineSide(engine, metrics, publisher, layout, llm)


def _zmq_publisher(llm: Any, config_json: str | None) -> Any:
    """The vLLM-format publisher of `--kv-events-config` (None when not enabled)."""
    if config_json is None:
        return None
    from hybridkv.serving.zmq_publisher import KvEventsConfig, ZmqKvEventPublisher

    config = KvEventsConfig.from_json(config_json)
    if not config.enabled:
        return None
    return ZmqKvEventPublisher(config, llm.kv, running=lambda: llm.scheduler.running)


class Publishers:
    """Several block event publishers behind the one the server starts and closes."""

    def __init__(self, publishers: list[Any]) -> None:
        self.publishers = publishers

    def start(self) -> None:
        for p in self.publishers:
            p.start()

    def publish(self, events: Any) -> None:
        for p in self.publishers:
            p.publish(events)

    def close(self) -> None:
        for p in self.publishers:
            p.close()
