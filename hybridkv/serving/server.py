"""`hybridkv serve MODEL`: build the engine and the app, run uvicorn.

The engine runs in a process of its own (`engine_process.py`), or with
`--no-engine-process` on a thread of this one (`engine_side.py` builds it either
way). SIGTERM or Ctrl-C: uvicorn stops accepting connections, waits for in-flight
requests (at most `--drain-timeout` seconds), then the engine and the event
publisher stop and the process exits 0. If the engine loop dies (or its process
exits), `/health` answers 503 at once, the server drains the same way and the
process exits 1, so a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
from typing import Any

from hybridkv.serving.engine_side import EngineSide, build_engine_side, build_llm, log_startup
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


def max_model_len(own: int, requested: int | None) -> int:
    """The served context length: `--max-model-len`, at most the model's own (`own`)."""
    if requested is None:
        return int(own)
    if requested > own:
        raise ValueError(f"--max-model-len {requested} is more than the model's context "
                         f"length ({own})")
    return requested


def build_front(side: EngineSide, tokenizer: Any, *, vocab_size: int, context_len: int,
                max_num_seqs: int, model_name: str, api_key: str | None = None,
                max_queue: int = DEFAULT_MAX_QUEUE,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                max_prompt_chars: int | None = None) -> Any:
    """The routes' state around an engine side (in this process or another)."""
    from hybridkv import __version__
    from hybridkv.serving.app import ServerState
    from hybridkv.serving.completions import CompletionService
    from hybridkv.serving.prompts import PromptBuilder

    prompts = PromptBuilder(tokenizer, vocab_size, context_len, max_prompt_chars)
    service = CompletionService(side.engine, prompts, model_name,
                                max_live=max_num_seqs + max_queue, metrics=side.metrics)
    return ServerState(engine=side.engine, service=service, prompts=prompts,
                       metrics=side.metrics, model_name=model_name, layout=side.layout,
                       api_key=api_key, max_body_bytes=max_body_bytes,
                       publisher=side.publisher, version=__version__)


def build_state(llm: Any, *, model_name: str, instance_id: str, base_url: str,
                api_key: str | None = None, events_url: str | None = None,
                kv_events_config: str | None = None,
                max_queue: int = DEFAULT_MAX_QUEUE,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                context_len: int | None = None, max_prompt_chars: int | None = None,
                engine_cores: frozenset[int] | None = None) -> Any:
    """Engine front, metrics, publisher and routes' state around `llm`, all in this
    process (its engine thread bound to `engine_cores` when given)."""
    side = build_engine_side(llm, model_name=model_name, instance_id=instance_id,
                             base_url=base_url, events_url=events_url,
                             kv_events_config=kv_events_config, engine_cores=engine_cores)
    return build_front(side, llm.tokenizer, vocab_size=llm.runner.vocab_size,
                       context_len=context_len or llm.runner.max_model_len,
                       max_num_seqs=llm.scheduler.max_num_seqs, model_name=model_name,
                       api_key=api_key, max_queue=max_queue, max_body_bytes=max_body_bytes,
                       max_prompt_chars=max_prompt_chars)


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
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model_name = args.served_model_name or args.model
    instance_id = args.instance_id or f"{args.host}:{args.port}"
    base_url = f"http://{args.host}:{args.port}"
    engine_process = args.engine_process and _can_fork()
    if args.engine_process and not engine_process:
        logger.warning("this platform cannot fork: the engine runs on a thread of the server")
    if engine_process:  # forked first, before any thread starts here
        state = _state_with_engine_process(args, model_name, instance_id, base_url)
    else:
        state = _state_in_process(args, model_name, instance_id, base_url, engine_cores)
    import uvicorn

    from hybridkv.serving.app import build_app

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
    try:
        server.run()
    finally:
        _stop_unstarted(state)
    if state.engine.error is not None:
        logger.error("exiting after the engine failed: %r", state.engine.error)
        return 1
    logger.info("stopped")
    return 0 if server.started else 1


def _state_in_process(args: argparse.Namespace, model_name: str, instance_id: str,
                      base_url: str, engine_cores: frozenset[int] | None) -> Any:
    """The routes' state with the engine on a thread of this process."""
    llm = build_llm(args)
    context_len = max_model_len(llm.runner.max_model_len, args.max_model_len)
    state = build_state(llm, model_name=model_name, instance_id=instance_id,
                        base_url=base_url, api_key=args.api_key,
                        events_url=args.events, max_queue=args.max_queue,
                        kv_events_config=args.kv_events_config,
                        max_body_bytes=args.max_body_bytes, context_len=context_len,
                        max_prompt_chars=args.max_prompt_chars, engine_cores=engine_cores)
    log_startup(llm, args, model_name, engine_cores)
    return state


def _state_with_engine_process(args: argparse.Namespace, model_name: str, instance_id: str,
                               base_url: str) -> Any:
    """The routes' state with the engine in a process of its own."""
    from hybridkv.serving.engine_process import start_engine_process

    remote, info = start_engine_process(args, model_name=model_name,
                                        instance_id=instance_id, base_url=base_url)
    try:
        from hybridkv.engine.tokenizer import load_tokenizer

        context_len = max_model_len(info["max_model_len"], args.max_model_len)
        side = EngineSide(remote, remote.metrics, None, info["layout"])
        state = build_front(side, load_tokenizer(args.model), vocab_size=info["vocab_size"],
                            context_len=context_len, max_num_seqs=info["max_num_seqs"],
                            model_name=model_name, api_key=args.api_key,
                            max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                            max_prompt_chars=args.max_prompt_chars)
    except BaseException:
        remote.kill()
        raise
    logger.info("engine process %d ready", info["pid"])
    return state


def _can_fork() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


def _stop_unstarted(state: Any) -> None:
    """An engine process whose server never started (say, its port was taken) is
    never stopped by the app's shutdown: end it here."""
    kill = getattr(state.engine, "kill", None)
    if kill is not None:
        kill()


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
