"""`hybridkv serve MODEL`: build the engine and the app, run uvicorn.

SIGTERM or Ctrl-C: uvicorn stops accepting connections, waits for in-flight
requests (at most `--drain-timeout` seconds), then the engine thread and the
event publisher stop and the process exits 0. If the engine loop dies,
`/health` answers 503 at once, the server drains the same way and the
process exits 1, so a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
from typing import Any

from hybridkv.serving.options import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_QUEUE

logger = logging.getLogger("hybridkv.serving")


def _check_args(args: argparse.Namespace) -> None:
    for name in ("port", "max_queue", "max_body_bytes", "block_size", "max_num_seqs",
                 "max_num_batched_tokens", "max_model_len", "max_prompt_chars"):
        value = getattr(args, name)
        if value is None:
            continue
        if value < (0 if name in ("port", "max_queue") else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be >= "
                             f"{0 if name in ('port', 'max_queue') else 1}, got {value}")
    if args.drain_timeout is not None and args.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be >= 0, got {args.drain_timeout}")
    if args.events is not None and not args.events.startswith(("redis://", "rediss://",
                                                                "unix://")):
        raise ValueError(f"--events {args.events!r} is not a Redis URL (redis://host:port/db)")
    if args.kv_events_config is not None:
        from hybridkv.serving.zmq_publisher import KvEventsConfig

        KvEventsConfig.from_json(args.kv_events_config)


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


def max_model_len(llm: Any, requested: int | None) -> int:
    """The served context length: `--max-model-len`, at most the model's own."""
    own = llm.runner.max_model_len
    if requested is None:
        return int(own)
    if requested > own:
        raise ValueError(f"--max-model-len {requested} is more than the model's context "
                         f"length ({own})")
    return requested


def build_state(llm: Any, *, model_name: str, instance_id: str, base_url: str,
                api_key: str | None = None, events_url: str | None = None,
                kv_events_config: str | None = None,
                max_queue: int = DEFAULT_MAX_QUEUE,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                context_len: int | None = None, max_prompt_chars: int | None = None,
                engine_cores: frozenset[int] | None = None) -> Any:
    """Engine front, metrics, publisher and routes' state around `llm` (its engine
    thread bound to `engine_cores` when given)."""
    from hybridkv import __version__
    from hybridkv.serving.app import ServerState
    from hybridkv.serving.async_engine import AsyncEngine
    from hybridkv.serving.completions import CompletionService
    from hybridkv.serving.event_publisher import EventPublisher
    from hybridkv.serving.layout import kv_cache_layout
    from hybridkv.serving.metrics import ServerMetrics
    from hybridkv.serving.prompts import PromptBuilder

    layout = kv_cache_layout(llm, model_name, instance_id)
    metrics = ServerMetrics(model_name, llm)
    publisher = None
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
                         cpu_cores=engine_cores)
    prompts = PromptBuilder(llm.tokenizer, llm.runner.vocab_size,
                            context_len or llm.runner.max_model_len, max_prompt_chars)
    service = CompletionService(engine, prompts, model_name,
                                max_live=llm.scheduler.max_num_seqs + max_queue, metrics=metrics)
    return ServerState(engine=engine, service=service, prompts=prompts, metrics=metrics,
                       model_name=model_name, layout=layout, api_key=api_key,
                       max_body_bytes=max_body_bytes, publisher=publisher,
                       version=__version__)


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


def _semantic_front(args: argparse.Namespace, state: Any) -> Any:
    """`--semantic-cache`'s front on the server's metrics registry, or None."""
    from hybridkv.semantic.options import build_front

    tokenizer = state.prompts.tokenizer
    count = (lambda text: len(tokenizer.encode(text))) if tokenizer is not None else None
    return build_front(args, state.model_name, state.metrics.registry, count)


def run_server(args: argparse.Namespace) -> int:
    """Serve until SIGTERM / SIGINT; returns the exit code. ValueError for bad options."""
    _check_args(args)
    from hybridkv.serving.cpu_bind import parse_cpu_bind

    engine_cores = parse_cpu_bind(args.cpu_bind, args.threads)
    import uvicorn

    from hybridkv.serving.app import build_app

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    llm = build_llm(args)
    model_name = args.served_model_name or args.model
    context_len = max_model_len(llm, args.max_model_len)
    instance_id = args.instance_id or f"{args.host}:{args.port}"
    state = build_state(llm, model_name=model_name, instance_id=instance_id,
                        base_url=f"http://{args.host}:{args.port}", api_key=args.api_key,
                        events_url=args.events, max_queue=args.max_queue,
                        kv_events_config=args.kv_events_config,
                        max_body_bytes=args.max_body_bytes, context_len=context_len,
                        max_prompt_chars=args.max_prompt_chars, engine_cores=engine_cores)
    if engine_cores is not None:
        logger.info("engine thread bound to cores %s", sorted(engine_cores))
    from hybridkv.serving.summary import startup_summary

    for line in startup_summary(llm, model_name, context_len, args.eviction_policy).split("\n"):
        logger.info("%s", line)
    state.semantic = _semantic_front(args, state)
    app: Any = build_app(state)
    if args.access_log:
        from hybridkv.serving.access_log import AccessLog

        app = AccessLog(app)
    config = uvicorn.Config(app, host=args.host, port=args.port,
                            log_level=args.log_level, access_log=False,
                            timeout_graceful_shutdown=args.drain_timeout)
    server = uvicorn.Server(config)
    state.engine.on_death = lambda err: _stop_after_death(server, err)
    # uvicorn re-raises the signal that stopped it once it has drained; after a clean
    # drain the process should exit 0, so the handlers it restores do nothing
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    _freeze_startup_objects()
    server.run()
    if state.engine.error is not None:
        logger.error("exiting after the engine failed: %r", state.engine.error)
        return 1
    logger.info("stopped")
    return 0 if server.started else 1


def _freeze_startup_objects() -> None:
    """Startup leaves ~400k long-lived objects (torch, transformers, the model): moved
    out of the collector's sight, no full collection while serving and none at exit
    (seconds each on a small machine) walks them again."""
    gc.collect()
    gc.freeze()


def _stop_after_death(server: Any, err: BaseException) -> None:
    """The engine loop died: drain (every reader already has its 500) and exit."""
    logger.error("the engine loop died (%r); draining and exiting", err)
    server.should_exit = True
