"""The engine in a process of its own (`hybridkv serve`'s default).

Every torch operation releases the GIL and takes it back, so in one process the
HTTP side's work for each streamed token (events rendered, socket writes) and
the engine's steps take turns: on the tiny preset with 8 streams a decode step
took twice as long served as alone (benchmarks/RESULTS.md). Here the engine
process owns the LLM, its `AsyncEngine` (each step's deltas leave as one
message), the metrics and the block event publishers; the HTTP process keeps
the routes, tokenizing, detokenizing and the streams (`remote_engine.py`).

The engine process is forked before the HTTP side starts any thread. It ignores
SIGINT and SIGTERM: the server drains, then sends "stop"; when the server's end
of the pipe closes (the server died), it stops too.

Messages (pickled over one duplex pipe):
    server -> engine: ("add", job, requests), ("abort", request_ids),
                      ("metrics", key), ("rejected",), ("stop",)
    engine -> server: ("ready", info) or ("failed", message), then
                      ("deltas", [(job, Delta), ...]), ("metrics", key, text),
                      ("dead", cause), and last ("stopped",)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import sys
import threading
from typing import Any

from hybridkv.serving.engine_side import build_engine_side, build_llm, log_startup
from hybridkv.serving.remote_engine import RemoteEngine

logger = logging.getLogger("hybridkv.serving")


class EngineStartError(RuntimeError):
    """The engine process failed or exited before it was ready."""


def start_engine_process(args: argparse.Namespace, *, model_name: str, instance_id: str,
                         base_url: str) -> tuple[RemoteEngine, dict[str, Any]]:
    """Fork the engine process for the serve options `args`; wait until its LLM is
    built. Returns the handle and the engine's facts (`info`, see `_facts`)."""
    context = multiprocessing.get_context("fork")
    server_end, engine_end = context.Pipe(duplex=True)
    process = context.Process(target=_engine_main, name="hybridkv-engine", daemon=False,
                              args=(args, engine_end, server_end, model_name, instance_id,
                                    base_url))
    process.start()
    engine_end.close()
    while True:
        if server_end.poll(0.5):
            try:
                message = server_end.recv()
            except EOFError:
                message = ("failed", "the engine process closed its pipe")
            break
        if not process.is_alive():
            process.join()
            message = ("failed", f"the engine process exited with code {process.exitcode}")
            break
    if message[0] != "ready":
        process.join(10.0)
        server_end.close()
        kind = message[2] if len(message) > 2 else ""
        if kind == "ValueError":
            raise ValueError(message[1])
        if kind == "FileNotFoundError":
            raise FileNotFoundError(message[1])
        raise EngineStartError(f"the engine failed to start: {message[1]}")
    return RemoteEngine(process, server_end), message[1]


def _engine_main(args: argparse.Namespace, conn: Any, server_end: Any, model_name: str,
                 instance_id: str, base_url: str) -> None:
    """The engine process: build, answer the server's messages, stop."""
    server_end.close()  # the fork's copy: else the pipe outlives the server
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with contextlib.suppress(OSError, ValueError), send_lock:  # the server is gone
            conn.send(message)

    try:
        side = _build(args, model_name, instance_id, base_url,
                      lambda replies: send(("deltas", replies)))
    except Exception as err:  # noqa: BLE001 - reported to the server, which exits
        if not isinstance(err, ValueError | FileNotFoundError):  # bad options: no trace
            logger.exception("the engine failed to start")
        send(("failed", str(err), type(err).__name__))
        sys.exit(1)
    side.engine.on_death = lambda err: send(("dead", repr(err)))
    log_startup(side.llm, args, model_name, side.engine.cpu_cores)
    send(("ready", _facts(side)))
    gc.collect()
    gc.freeze()
    if side.publisher is not None:
        side.publisher.start()
    # the steps run on this thread, which built the model (see AsyncEngine.run); the
    # server's messages are read on another
    reader = threading.Thread(target=_serve_then_stop, args=(conn, side, send),
                              name="hybridkv-engine-pipe", daemon=True)
    reader.start()
    try:
        side.engine.run()
        reader.join()  # after a death: metrics are still answered until "stop"
    finally:
        if side.publisher is not None:
            side.publisher.close()
        send(("stopped",))
        conn.close()
    sys.exit(0)


def _build(args: argparse.Namespace, model_name: str, instance_id: str, base_url: str,
           deliver: Any) -> Any:
    from hybridkv.serving.cpu_bind import parse_cpu_bind

    engine_cores = parse_cpu_bind(args.cpu_bind, args.threads)
    llm = build_llm(args)
    return build_engine_side(llm, model_name=model_name, instance_id=instance_id,
                             base_url=base_url, events_url=args.events,
                             kv_events_config=args.kv_events_config,
                             engine_cores=engine_cores, deliver=deliver)


def _facts(side: Any) -> dict[str, Any]:
    """What the HTTP side needs to know about the engine."""
    llm = side.llm
    return {"vocab_size": int(llm.runner.vocab_size),
            "max_model_len": int(llm.runner.max_model_len),
            "max_num_seqs": int(llm.scheduler.max_num_seqs), "layout": side.layout,
            "pid": os.getpid()}


def _serve_then_stop(conn: Any, side: Any, send: Any) -> None:
    """`_serve`, then stop the engine loop however it ended."""
    try:
        _serve(conn, side, send)
    finally:
        side.engine.request_stop()


def _serve(conn: Any, side: Any, send: Any) -> None:
    """Apply the server's messages until "stop" or until its end of the pipe closes."""
    engine, metrics = side.engine, side.metrics
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            logger.warning("the server closed the engine's pipe; stopping")
            return
        kind = message[0]
        if kind == "add":
            engine.submit(message[2], message[1])
        elif kind == "abort":
            engine.abort(message[1])
        elif kind == "metrics":
            send(("metrics", message[1], metrics.render()))
        elif kind == "rejected":
            metrics.record_rejected()
        elif kind == "stop":
            return
