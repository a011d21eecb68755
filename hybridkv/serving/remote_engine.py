"""The HTTP process's handle on an engine running in its own process.

`RemoteEngine` answers the routes exactly as `AsyncEngine` does (`generate`,
`is_running`, `error`, `num_live`, `on_death`, `start`, `stop`), over a pipe to
the engine process (`engine_process.py`): requests and aborts go one message
each; each engine step's deltas come back as one message, which a reader thread
hands to the event loop with one wake-up. `RemoteMetrics` stands in for the
server's metrics: `/metrics` is the engine process's registry (rendered there,
between its steps) followed by this process's own (the semantic cache's).

If the engine process reports its loop's failure, or exits, every reader gets a
500 naming the cause, `is_running` turns False and `on_death` is called on the
event loop (the server then drains and exits non-zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from hybridkv.serving.async_engine import Delta, EngineDead, EngineRequest

logger = logging.getLogger("hybridkv.serving")
METRICS_TIMEOUT_SECONDS = 10.0
_DEAD = object()  # put into every reader's queue when the engine is gone


class RemoteEngine:
    """The engine process behind `connection` (`process`: its handle, for
    `is_alive`, `join` and `exitcode`)."""

    def __init__(self, process: Any, connection: Any) -> None:
        self.process = process
        self._conn = connection
        self._send_lock = threading.Lock()
        self._jobs: dict[int, asyncio.Queue] = {}
        self._job_ids = itertools.count()
        self._waiters: dict[int, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self.num_live = 0
        self.error: BaseException | None = None
        self.on_death: Callable[[BaseException], None] | None = None
        self.metrics = RemoteMetrics(self)

    # ---- lifecycle (event loop) ----------------------------------------------

    def start(self) -> None:
        """Start reading the engine's messages; call from the event loop."""
        self._loop = asyncio.get_running_loop()
        self._reader = threading.Thread(target=self._read, name="hybridkv-engine-reader",
                                        daemon=True)
        self._reader.start()

    async def stop(self, timeout: float = 30.0) -> None:
        """Ask the engine process to abort what runs and exit; wait for it."""
        if self._stopping:
            return
        self._stopping = True
        self._send(("stop",))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.process.join, timeout)
        if self.process.is_alive():
            logger.warning("the engine process did not stop in %.0f s; killing it", timeout)
            self.process.kill()
            await loop.run_in_executor(None, self.process.join, 5.0)
        if self._reader is not None:
            await loop.run_in_executor(None, self._reader.join, 5.0)
        self._conn.close()

    def kill(self, timeout: float = 10.0) -> None:
        """End the engine process now if it still runs (blocking; no drain)."""
        if not self.process.is_alive():
            return
        self._stopping = True
        self._send(("stop",))
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)

    @property
    def is_running(self) -> bool:
        return self.error is None and not self._stopping and self.process.is_alive()

    # ---- requests (event loop) -----------------------------------------------

    async def generate(self, requests: list[EngineRequest]) -> AsyncGenerator[Delta, None]:
        """As `AsyncEngine.generate`: deltas of every request, tagged by index."""
        if not self.is_running:
            raise EngineDead(f"the engine is not running ({self.error!r})")
        job = next(self._job_ids)
        results: asyncio.Queue = asyncio.Queue()
        self._jobs[job] = results
        pending = {i: r.request_id for i, r in enumerate(requests)}
        self.num_live += len(requests)
        try:
            self._send(("add", job, requests))
            while pending:
                delta = await results.get()
                if delta is _DEAD:
                    for index in sorted(pending):
                        yield Delta(index, [], error=f"engine failed: {self.error}", status=500)
                    self.num_live -= len(pending)
                    pending.clear()
                    return
                if delta.error is not None or delta.finish_reason is not None:
                    if pending.pop(delta.index, None) is not None:
                        self.num_live -= 1
                yield delta
        finally:
            self._jobs.pop(job, None)
            if pending:
                self.num_live -= len(pending)
                if self.is_running:
                    self._send(("abort", list(pending.values())))

    async def render_metrics(self) -> bytes:
        """The engine process's Prometheus text (b"" when it cannot answer)."""
        if not self.is_running or self._loop is None:
            return b""
        key = next(self._job_ids)
        waiter = self._loop.create_future()
        self._waiters[key] = waiter
        self._send(("metrics", key))
        try:
            return await asyncio.wait_for(waiter, METRICS_TIMEOUT_SECONDS)
        except asyncio.TimeoutError:
            logger.warning("the engine process did not send its metrics in %.0f s",
                           METRICS_TIMEOUT_SECONDS)
            return b""
        finally:
            self._waiters.pop(key, None)

    def record_rejected(self) -> None:
        self._send(("rejected",))

    # ---- the pipe ------------------------------------------------------------

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError) as err:  # the engine process is gone
            if not self._stopping and self._loop is not None:
                self._loop.call_soon(self._dead, f"the engine process is gone ({err!r})")

    def _read(self) -> None:
        """Reader thread: each message to the event loop, until the engine exits."""
        assert self._loop is not None
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "stopped":
                return
            with contextlib.suppress(RuntimeError):  # the loop closed
                self._loop.call_soon_threadsafe(self._dispatch, message)
        if not self._stopping:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._exited)

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == "deltas":
            for job, delta in message[1]:
                results = self._jobs.get(job)
                if results is not None:
                    results.put_nowait(delta)
        elif kind == "metrics":
            waiter = self._waiters.get(message[1])
            if waiter is not None and not waiter.done():
                waiter.set_result(message[2])
        elif kind == "dead":
            self._dead(message[1])

    def _exited(self) -> None:
        self.process.join(1.0)
        self._dead(f"the engine process exited (exit code {self.process.exitcode})")

    def _dead(self, cause: str) -> None:
        """The engine is gone: answer every reader and tell the server, once."""
        if self.error is not None or self._stopping:
            return
        self.error = EngineDead(cause)
        logger.error("engine failed: %s", cause)
        for results in self._jobs.values():
            results.put_nowait(_DEAD)
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_result(b"")
        if self.on_death is not None:
            self.on_death(self.error)


class RemoteMetrics:
    """The server's metrics when the engine runs in its own process."""

    def __init__(self, engine: RemoteEngine) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()  # this process's own metrics (semantic cache)

    def record_rejected(self) -> None:
        self.engine.record_rejected()

    async def render_async(self) -> bytes:
        return await self.engine.render_metrics() + generate_latest(self.registry)
