"""The async front of the engine: many connections, one continuous batch.

One dedicated thread owns the `LLM` and runs its loop: take new requests and
aborts from a command queue, run one `LLM.step()`, hand every request's new
tokens to the event loop (`loop.call_soon_threadsafe`, one call per step),
publish the step's block events and update the metrics. The event loop never
runs model code and never touches the `LLM`; it only queues commands and
reads deltas from per-request asyncio queues.

With `deliver` (a callable), the engine thread hands each step's replies to it
instead, as one list of `(key, Delta)` pairs: `submit(requests, key)` and
`abort(request_ids)` then drive the engine without an event loop (the engine
process, `engine_process.py`, sends them to the HTTP process).

A request whose reader goes away (client disconnected, handler cancelled) is
aborted: the engine thread frees its blocks before the next step. A request
that failed alone (`SeqState.error`) ends with an error delta (status 500)
while the others go on. If the loop itself dies, every reader gets a 500
naming the cause, `is_running` turns False at once and `on_death` is
called on the event loop (the server then drains and exits non-zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from hybridkv.engine.sampling import SamplingParams
from hybridkv.engine.scheduler import SeqState
from hybridkv.kv_cache.events import BlockEvent
from hybridkv.serving.cpu_bind import bind_current_thread

logger = logging.getLogger("hybridkv.serving")


@dataclass
class EngineRequest:
    """One sequence to generate (an HTTP request with n choices sends n)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    stream: bool = True  # False: one delta at the finish (no wake-up per token)


@dataclass
class Delta:
    """What one step added to choice `index` of an HTTP request."""

    index: int
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None  # the request was refused (a ValueError message) or failed
    status: int = 400  # HTTP status of `error`: 400 refused, 500 engine failure
    logprobs: list[Any] = field(default_factory=list)  # TokenLogprobs of `token_ids`
    prompt_logprobs: list[Any] | None = None  # with the first delta that has tokens


@dataclass
class _Live:
    """Engine-thread bookkeeping of one running sequence."""

    seq: SeqState
    index: int
    queue: Any  # the reader's asyncio.Queue (or the key `deliver` gets)
    stream: bool
    sent: int = 0  # output tokens seen (metrics)
    delivered: int = 0  # output tokens handed to the reader
    last_token_time: float | None = None
    sent_prompt_logprobs: bool = False


class EngineDead(RuntimeError):
    """The engine loop stopped after an internal error."""


class AsyncEngine:
    """Runs `llm` on a dedicated thread and streams tokens to asyncio readers.

    `metrics` (ServerMetrics or None), `on_events` (called on the engine
    thread with each step's block events) and `on_add` (with each request
    accepted) are optional observers. `cpu_cores`: the cores the engine thread
    runs on (see `cpu_bind`; None leaves it to the kernel). `deliver`: see the
    module's docstring.
    """

    def __init__(self, llm: Any, *, metrics: Any = None,
                 on_events: Callable[[list[BlockEvent]], None] | None = None,
                 on_death: Callable[[BaseException], None] | None = None,
                 on_add: Callable[[Any], None] | None = None,
                 cpu_cores: frozenset[int] | None = None,
                 deliver: Callable[[list[tuple[Any, Delta]]], None] | None = None) -> None:
        self.llm = llm
        self.cpu_cores = cpu_cores  # the engine thread's cores (None: not bound)
        self.metrics = metrics
        self.on_death = on_death
        self._on_events = on_events
        self._on_add = on_add  # called with each request the engine accepts
        self._send = deliver  # None: replies go to asyncio queues on `self._loop`
        self._events: list[BlockEvent] = []
        if on_events is not None:
            llm.kv.subscribe(self._events.append)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}  # engine thread only
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.num_live = 0  # event loop side: sequences submitted and not yet done
        self.error: BaseException | None = None

    # ---- lifecycle (event loop) ----------------------------------------------

    def start(self) -> None:
        """Start the engine thread; call from the event loop that will read results
        (or from any thread, with `deliver`)."""
        if self._send is None:
            self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="hybridkv-engine", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """Run the engine loop on the calling thread until `request_stop` (with `deliver`
        only). The engine process steps on the thread that built the model: torch's
        OpenMP pool belongs to the thread that first ran an operator, and a second
        thread's pool makes libgomp count more threads than cores and put its workers
        to sleep between operators (a decode step of the 270M shape on 2 threads:
        about 40 ms instead of 33)."""
        if self._send is None:
            raise RuntimeError("AsyncEngine.run() needs `deliver`; use start() with an "
                               "event loop")
        self._thread = threading.current_thread()
        try:
            self._run()
        finally:
            self._thread = None

    def request_stop(self) -> None:
        """Ask the engine loop to abort what is still running and end (returns at once)."""
        self._commands.put(("stop",))

    async def stop(self) -> None:
        """Abort what is still running and join the engine thread."""
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """`stop()`, blocking the calling thread until the engine thread has ended."""
        if self._thread is None or self._thread is threading.current_thread():
            return
        self.request_stop()
        self._thread.join()
        self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # ---- requests (event loop) -----------------------------------------------

    async def generate(self, requests: list[EngineRequest]) -> AsyncGenerator[Delta, None]:
        """Deltas of all `requests` (tagged by their index) until each finishes.

        A streamed request (`stream=True`) first gets an empty acceptance
        delta, then one delta per step that sampled for it; a plain one gets
        a single delta at its finish. A request the engine refuses gets one
        delta with `error` set instead. Leaving the iteration early aborts
        the unfinished requests.
        """
        if not self.is_running:
            raise EngineDead(f"the engine is not running ({self.error!r})")
        results: asyncio.Queue[Delta] = asyncio.Queue()
        pending = {i: r.request_id for i, r in enumerate(requests)}
        self.num_live += len(requests)
        self.submit(requests, results)
        try:
            if self.error is not None:  # died before it could see the command
                raise EngineDead(f"the engine failed: {self.error!r}")
            while pending:
                delta = await results.get()
                if delta.error is not None or delta.finish_reason is not None:
                    pending.pop(delta.index, None)
                    self.num_live -= 1
                yield delta
        finally:
            if pending:
                self.num_live -= len(pending)
                self.abort(list(pending.values()))

    def submit(self, requests: list[EngineRequest], key: Any) -> None:
        """Queue `requests`; their deltas go to `key` (an asyncio.Queue, or what
        `deliver` gets with them)."""
        self._commands.put(("add", requests, key))

    def abort(self, request_ids: list[str]) -> None:
        """Queue the abort of these requests (unknown or finished ones are ignored)."""
        self._commands.put(("abort", request_ids))

    # ---- the engine thread ---------------------------------------------------

    def _run(self) -> None:
        try:
            bind_current_thread(self.cpu_cores)
            while self._take_commands(block=not self.llm.has_unfinished_requests()):
                if self.llm.has_unfinished_requests():
                    self.llm.step()
                    self._deliver(self._collect_deltas())
                self._after_step()
        except BaseException as err:  # noqa: BLE001 - reported to every reader, then logged
            self.error = err  # set before the queue is drained (see generate)
            logger.exception("engine loop failed: %s", err)
            self._fail_all(err)
            self._report_death(err)

    def _report_death(self, err: BaseException) -> None:
        if self._send is not None:
            if self.on_death is not None:
                self.on_death(err)
            return
        if self.on_death is None or self._loop is None or self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.on_death, err)

    def _take_commands(self, block: bool) -> bool:
        """Apply queued commands (waiting for one if `block`); False to stop."""
        try:
            command = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        replies: list[tuple[asyncio.Queue, Delta]] = []
        while True:
            if command[0] == "stop":
                replies += self._abort([*self._live], notify=True)
                self._deliver(replies)
                return False
            if command[0] == "add":
                self._add(command[1], command[2], replies)
            else:
                self._abort(command[1])
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
        self._deliver(replies)
        self._after_step()
        return True

    def _add(self, requests: list[EngineRequest], results: asyncio.Queue,
             replies: list[tuple[asyncio.Queue, Delta]]) -> None:
        for index, r in enumerate(requests):
            prompt = {"prompt_token_ids": r.prompt_token_ids, "cache_salt": r.cache_salt}
            try:
                seq = self.llm.add_request(prompt, r.params, request_id=r.request_id,
                                           arrival_time=r.arrival_time)
            except ValueError as err:
                replies.append((results, Delta(index, [], error=self._explain(err, r))))
                continue
            except Exception as err:  # noqa: BLE001 - this request alone fails
                logger.exception("request %s failed on arrival", r.request_id)
                replies.append((results, Delta(index, [], error=f"request failed: {err!r}",
                                               status=500)))
                continue
            self._live[r.request_id] = _Live(seq, index, results, r.stream)
            if self._on_add is not None:
                self._on_add(seq.request)
            if r.stream:
                replies.append((results, Delta(index, [],
                                               num_prompt_tokens=len(r.prompt_token_ids))))

    def _explain(self, err: ValueError, r: EngineRequest) -> str:
        """A refusal's message; one for a pool too small names the server flags."""
        message = str(err)
        if "than the whole pool" not in message:
            return message
        kv, scheduler = self.llm.kv, self.llm.scheduler
        total = min(len(r.prompt_token_ids) + r.params.max_tokens, self.llm.runner.max_model_len)
        needed = kv.coordinator.max_blocks_held(total, scheduler.max_num_batched_tokens)
        head = message.split("; raise")[0]
        return (f"{head}: it needs {needed} blocks of {kv.pool.num_blocks - 1} usable; start "
                f"the server with a larger --num-blocks or --kv-cache-bytes")

    def _abort(self, request_ids: list[str], notify: bool = False
               ) -> list[tuple[asyncio.Queue, Delta]]:
        """Abort these requests; with `notify`, the finishing deltas for their readers."""
        now = time.perf_counter()
        replies = []
        for rid in request_ids:
            live = self._live.pop(rid, None)
            if not self.llm.abort_request(rid) or live is None:
                continue
            if self.metrics is not None:
                self.metrics.record_finish("abort", now - live.seq.arrival_time)
            if notify:
                seq = live.seq
                replies.append((live.queue, Delta(
                    live.index, seq.request.output_token_ids[live.delivered:], "abort", None,
                    seq.request.num_prompt_tokens, max(seq.num_cached_tokens, 0))))
        return replies

    def _collect_deltas(self) -> list[tuple[asyncio.Queue, Delta]]:
        """New tokens and finishes of every live sequence since the last step."""
        now = time.perf_counter()
        out = []
        for rid, live in list(self._live.items()):
            seq = live.seq
            n = seq.num_output_tokens
            if n == live.sent and seq.finish_reason is None:
                continue
            self._record_tokens(live, n - live.sent, now)
            if not live.stream and seq.finish_reason is None:
                live.sent = n  # counted; the tokens go out with the finish
                continue
            out.append((live.queue, self._delta(live, n)))
            if seq.finish_reason is not None:
                del self._live[rid]
                if self.metrics is not None:
                    self.metrics.record_finish(seq.finish_reason, now - seq.arrival_time)
        return out

    @staticmethod
    def _delta(live: _Live, n: int) -> Delta:
        """What `live` has produced since its last delta (its first `n` output tokens)."""
        seq = live.seq
        start = seq.request.num_prompt_tokens
        new = seq.request.all_token_ids[start + live.delivered:start + n]
        logprobs = list(getattr(seq, "logprobs", ())[live.delivered:n])
        prompt_logprobs = None
        if not live.sent_prompt_logprobs and n > 0:
            prompt_logprobs = getattr(seq, "prompt_logprobs", None)
            live.sent_prompt_logprobs = True
        live.sent = live.delivered = n
        error = getattr(seq, "error", None) if seq.finish_reason == "error" else None
        if seq.finish_reason == "error":
            error = f"request failed: {error or 'unknown error'}"
        return Delta(live.index, new, seq.finish_reason, seq.stop_reason,
                     seq.request.num_prompt_tokens, max(seq.num_cached_tokens, 0),
                     error=error, status=500, logprobs=logprobs,
                     prompt_logprobs=prompt_logprobs)

    def _record_tokens(self, live: _Live, num_new: int, now: float) -> None:
        if self.metrics is None or num_new == 0:
            return
        if live.last_token_time is None:
            self.metrics.record_first_token(now - live.seq.arrival_time)
            self.metrics.record_tokens(num_new, None)
        else:
            self.metrics.record_tokens(num_new, (now - live.last_token_time) / num_new)
        live.last_token_time = now

    def _deliver(self, replies: list[tuple[Any, Delta]]) -> None:
        if replies and self._send is not None:
            self._send(replies)
        elif replies and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_put_all, replies)

    def _after_step(self) -> None:
        if self.metrics is not None:
            self.metrics.record_engine(self.llm)
        if self._events and self._on_events is not None:
            batch = self._events[:]
            self._events.clear()
            self._on_events(batch)

    def _fail_all(self, err: BaseException) -> None:
        """Answer every reader, present and queued, with the engine's failure."""
        message = f"engine failed: {err!r}"
        replies = [(live.queue, Delta(live.index, [], error=message, status=500))
                   for live in self._live.values()]
        self._live.clear()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command[0] == "add":
                replies += [(command[2], Delta(i, [], error=message, status=500))
                            for i in range(len(command[1]))]
        with contextlib.suppress(RuntimeError):
            self._deliver(replies)


def _put_all(replies: list[tuple[asyncio.Queue, Delta]]) -> None:
    for results, delta in replies:
        results.put_nowait(delta)
