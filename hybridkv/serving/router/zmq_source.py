"""Follows a vLLM backend's KV event publisher (ZMQ) into its `VllmCacheView`.

`--kv-event-source URL=ENDPOINT` (vllm-router's flags): the SUB socket
connects to ENDPOINT (the publisher binds `tcp://*:PORT`; the router
connects to `tcp://host:PORT`); `--kv-event-replay-source URL=ENDPOINT`
names the publisher's `replay_endpoint`, where a DEALER asks for missed
batches.

Batches carry sequence numbers counting from 0. The source applies each
batch once, in order:

- the first batch it sees has seq > 0 (it joined late): the batches before
  it are asked from the replay socket (from 0);
- seq jumps past last + 1 (batches dropped on the way): the missing ones
  are asked from the replay socket;
- seq <= last (the publisher restarted and counts from 0 again): the view
  is cleared, then the batches before this one are replayed.

A replay that cannot supply every missing batch (no replay endpoint, no
answer within REPLAY_TIMEOUT_S, or the publisher's buffer no longer holds
them) clears the view before going on: it may then hold less than the
backend, never blocks the backend does not hold. A payload that does not
decode is counted and skipped.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from hybridkv.serving.kv_events_wire import END_SEQ, decode_batch, seq_bytes, seq_from_bytes
from hybridkv.serving.router.routing import Router
from hybridkv.serving.router.vllm_view import VllmCacheView

logger = logging.getLogger("hybridkv.router")
REPLAY_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class EventSource:
    backend_url: str
    endpoint: str
    replay_endpoint: str | None = None


def parse_event_source(text: str, flag: str = "--kv-event-source") -> tuple[str, str]:
    """`URL=tcp://host:port` -> (backend URL, endpoint); ValueError naming what is
    wrong. vllm-router's comma list (one endpoint per data-parallel rank) is
    refused beyond one rank: each rank caches apart, one view cannot hold them."""
    url, sep, endpoint = text.partition("=")
    if not sep or not url.startswith(("http://", "https://")):
        raise ValueError(f"{flag} {text!r} must be BACKEND_URL=tcp://host:port")
    if "," in endpoint:
        raise ValueError(f"{flag} {text!r}: one endpoint per backend (data-parallel ranks "
                         f"are not supported)")
    if not endpoint.startswith(("tcp://", "ipc://")):
        raise ValueError(f"{flag} {text!r}: the endpoint must be tcp://host:port")
    return url.rstrip("/"), endpoint


def event_sources(live: list[str], replay: list[str]) -> list[EventSource]:
    """`--kv-event-source` and `--kv-event-replay-source` values -> sources;
    ValueError for a replay source of a backend without a live one, or repeats."""
    pairs = [parse_event_source(text) for text in live]
    urls = [url for url, _ in pairs]
    if len(set(urls)) != len(urls):
        raise ValueError("--kv-event-source names a backend twice")
    replays = dict(parse_event_source(text, "--kv-event-replay-source") for text in replay)
    unknown = sorted(set(replays) - set(urls))
    if unknown:
        raise ValueError(f"--kv-event-replay-source for {unknown}, which have no "
                         f"--kv-event-source")
    return [EventSource(url, endpoint, replays.get(url)) for url, endpoint in pairs]


class ZmqEventSource:
    """One subscriber task: `run()` until cancelled."""

    def __init__(self, source: EventSource, view: VllmCacheView, topic: bytes = b"") -> None:
        self.source = source
        self.view = view
        self.topic = topic
        self.last_seq: int | None = None
        self.num_bad = 0
        self.num_replayed = 0
        self.num_gaps = 0
        self.num_restarts = 0
        self.num_lost = 0  # times batches could not be recovered (view cleared)

    async def run(self) -> None:
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.source.endpoint)
        try:
            while True:
                frames = await sub.recv_multipart()
                await self.receive(frames)
        finally:
            sub.close(linger=0)

    async def receive(self, frames: list[bytes]) -> None:
        """Handle one live message `[topic, seq, payload]`."""
        if len(frames) != 3:
            self.num_bad += 1
            return
        try:
            seq = seq_from_bytes(frames[1])
        except ValueError:
            self.num_bad += 1
            return
        if self.last_seq is not None and seq <= self.last_seq:
            self.num_restarts += 1
            logger.warning("KV events of %s restarted at seq %d (after %d): clearing its view",
                           self.source.backend_url, seq, self.last_seq)
            self.view.reset()
            self.last_seq = None
        expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq > expected:
            if self.last_seq is not None:
                self.num_gaps += 1
            await self.recover(expected, seq)
        self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        if self.last_seq is not None and seq <= self.last_seq:
            return
        self.last_seq = seq
        try:
            batch = decode_batch(payload)
        except ValueError as err:
            self.num_bad += 1
            logger.warning("skipping KV event batch %d of %s: %s", seq,
                           self.source.backend_url, err)
            return
        self.view.apply(batch)

    async def recover(self, start: int, until: int) -> None:
        """Batches start .. until-1 from the replay socket, applied in order; the
        view is cleared first when they cannot all be had."""
        batches = await self.replay(start) if self.source.replay_endpoint else []
        wanted = [(s, p) for s, p in batches if start <= s < until]
        got = [s for s, _ in wanted]
        if got != list(range(start, until)):
            self.num_lost += 1
            if self.last_seq is not None or start > 0 or got:
                logger.warning("KV events %d..%d of %s could not be replayed: clearing its "
                               "view", start, until - 1, self.source.backend_url)
            self.view.reset()
            self.last_seq = until - 1
            return
        for seq, payload in wanted:
            self._apply(seq, payload)
            self.num_replayed += 1

    async def replay(self, start: int) -> list[tuple[int, bytes]]:
        """(seq, payload) of every batch the publisher still buffers from `start`;
        [] when it does not answer in time."""
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(self.source.replay_endpoint)
        out: list[tuple[int, bytes]] = []
        try:
            await dealer.send_multipart([b"", seq_bytes(start)])
            while await dealer.poll(int(REPLAY_TIMEOUT_S * 1000), zmq.POLLIN):
                frames = await dealer.recv_multipart()
                if len(frames) != 4 or frames[2] == END_SEQ:
                    return out
                out.append((seq_from_bytes(frames[2]), frames[3]))
            return []  # no end marker: the answer is not to be trusted whole
        except (zmq.ZMQError, ValueError) as err:
            logger.warning("replay from %s failed: %s", self.source.replay_endpoint, err)
            return []
        finally:
            dealer.close(linger=0)


class ZmqSources:
    """The ZMQ event sources of a router, one task per backend once it joined."""

    def __init__(self, router: Router, sources: list[EventSource]) -> None:
        self.router = router
        self.by_url = {s.backend_url: s for s in sources}
        self.urls = frozenset(self.by_url)
        self.followers: dict[str, ZmqEventSource] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    def follow(self, url: str, model: str | None) -> None:
        """Start following the backend's events (once; again if its task ended)."""
        task = self.tasks.get(url)
        if task is not None and not task.done():
            return
        follower = self.followers.get(url)
        if follower is None:
            view = VllmCacheView(url, self.router, model)
            follower = self.followers[url] = ZmqEventSource(self.by_url[url], view)
        self.tasks[url] = asyncio.create_task(follower.run())

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
