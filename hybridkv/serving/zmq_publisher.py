"""`hybridkv serve --kv-events-config JSON`: block events in vLLM's wire format.

The JSON is vLLM's `KVEventsConfig`: `enable_kv_cache_events`, `publisher`
("zmq" or "null"), `endpoint` (PUB; `tcp://*:PORT` binds, `tcp://host:PORT`
connects), `replay_endpoint` (ROUTER, bound), `buffer_steps` (batches kept
for replay), `hwm`, `max_queue_size`, `topic`. Every engine step that
produced block events becomes one `KVEventBatch` (`kv_events_wire`), sent
as `[topic, seq, payload]` beside the Redis stream of `--events`.

A hybridkv block event names a hash and a group; vLLM's names the block's
tokens and its parent too. The publisher learns both from the requests:
each request's block hashes (at the pool's hash block size) are noted when
it is added and, for blocks of generated tokens, after each step; a group
block of size B ending at hash k is the tokens (k+1-B/h)*h .. (k+1)*h with
parent hash k - B/h. Hashes go out as vLLM's default does (the digest's
last 8 bytes as an unsigned int). A stored block whose tokens the
publisher never saw (output tokens of a request that finished in the step
that stored them) is not announced, nor is its removal.

Sockets live on one background thread; the engine thread only converts and
enqueues (a full queue drops the batch and counts it).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from hybridkv.kv_cache.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from hybridkv.serving.kv_events_wire import (
    END_SEQ,
    WireAllCleared,
    WireBatch,
    WireBlockRemoved,
    WireBlockStored,
    WireEvent,
    encode_batch,
    seq_bytes,
)
from hybridkv.serving.layout import group_type

logger = logging.getLogger("hybridkv.serving")
MEMO_BLOCKS = 1 << 18  # hash -> (request, index) entries kept
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class KvEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher not in (None, "zmq", "null"):
            raise ValueError(f"--kv-events-config publisher: {self.publisher!r} is not "
                             f"'zmq' or 'null'")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"--kv-events-config {name}: must be an int >= 1, got {value!r}")
        if not isinstance(self.endpoint, str) or "://" not in self.endpoint:
            raise ValueError(f"--kv-events-config endpoint: {self.endpoint!r} is not a ZMQ "
                             f"address (tcp://*:PORT)")

    @property
    def enabled(self) -> bool:
        return bool(self.enable_kv_cache_events) and self.publisher != "null"

    @classmethod
    def from_json(cls, text: str) -> KvEventsConfig:
        """Parse the flag's JSON; ValueError naming a bad or unknown field."""
        try:
            body = json.loads(text)
        except ValueError as err:
            raise ValueError(f"--kv-events-config is not JSON: {err}") from None
        if not isinstance(body, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"--kv-events-config: unknown field(s) {unknown}; known: "
                             f"{sorted(known)}")
        return cls(**body)


def wire_hash(block_hash: bytes) -> int:
    """vLLM's default external form of a hash: its last 8 bytes, unsigned."""
    return int.from_bytes(block_hash, "big") & _MASK64


class BlockTokens:
    """Which request tokens every recent block hash covers (bounded memo)."""

    def __init__(self, hash_algo: str, hash_block_size: int, limit: int = MEMO_BLOCKS) -> None:
        self.hash_algo, self.hash_block_size, self.limit = hash_algo, hash_block_size, limit
        self.where: OrderedDict[bytes, tuple[Any, list[bytes], int]] = OrderedDict()
        self._noted: dict[str, int] = {}  # request id -> hashes noted

    def note(self, request: Any) -> None:
        """Remember the request's full blocks not noted yet."""
        hashes = request.block_hashes(self.hash_algo, self.hash_block_size)
        start = self._noted.get(request.request_id, 0)
        for k in range(start, len(hashes)):
            self.where[hashes[k]] = (request, hashes, k)
            self.where.move_to_end(hashes[k])
        self._noted[request.request_id] = len(hashes)
        while len(self.where) > self.limit:
            self.where.popitem(last=False)

    def forget_except(self, request_ids: Iterable[str]) -> None:
        keep = set(request_ids)
        self._noted = {rid: n for rid, n in self._noted.items() if rid in keep}

    def block(self, block_hash: bytes, stride: int
              ) -> tuple[bytes | None, list[int], str | None] | None:
        """(parent hash, tokens, salt of a first block) of the group block of
        `stride` hash blocks ending at `block_hash`; None if unknown."""
        found = self.where.get(block_hash)
        if found is None:
            return None
        request, hashes, k = found
        h = self.hash_block_size
        start, end = (k + 1 - stride) * h, (k + 1) * h
        parent = hashes[k - stride] if k >= stride else None
        salt = request.cache_salt if start == 0 else None
        return parent, list(request.all_token_ids[start:end]), salt


class ZmqKvEventPublisher:
    """Converts each step's block events and publishes them on ZMQ."""

    def __init__(self, config: KvEventsConfig, kv: Any,
                 running: Callable[[], Sequence[Any]] = tuple) -> None:
        self.config = config
        self.specs = list(kv.config.specs)
        self.tokens = BlockTokens(kv.hash_algo, kv.hash_block_size)
        self.running = running  # the requests still running (their new blocks)
        self._queue: queue.Queue[WireBatch | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.num_published = 0
        self.num_dropped = 0
        self.num_unknown = 0  # stored blocks whose tokens were not known
        self.error: BaseException | None = None

    # ---- engine thread ---------------------------------------------------------

    def note_request(self, request: Any) -> None:
        self.tokens.note(request)

    def publish(self, events: Sequence[BlockEvent]) -> None:
        """One engine step's events: converted, then queued for the socket thread."""
        wire = self.to_wire(events)
        if wire:
            self.send(wire)

    def send(self, events: list[WireEvent]) -> None:
        """Queue one batch (dropped and counted when the queue is full)."""
        try:
            self._queue.put_nowait(WireBatch(time.time(), events))
        except queue.Full:
            self.num_dropped += 1

    def to_wire(self, events: Sequence[BlockEvent]) -> list[WireEvent]:
        """The step's events in vLLM's form, after noting the running requests'
        new blocks."""
        running = [seq.request for seq in self.running()]
        for request in running:
            self.tokens.note(request)
        self.tokens.forget_except(r.request_id for r in running)
        return self.convert(events)

    def convert(self, events: Sequence[BlockEvent]) -> list[WireEvent]:
        out: list[WireEvent] = []
        for event in events:
            if isinstance(event, BlockStored):
                stored = self._stored(event)
                if stored is not None:
                    out.append(stored)
            elif isinstance(event, BlockRemoved):
                out.append(WireBlockRemoved([wire_hash(event.block_hash)], "GPU",
                                            event.group_id))
            elif isinstance(event, AllBlocksCleared):
                out.append(WireAllCleared())
        return out

    def _stored(self, event: BlockStored) -> WireBlockStored | None:
        spec = self.specs[event.group_id]
        stride = spec.block_size // self.tokens.hash_block_size
        found = self.tokens.block(event.block_hash, stride)
        if found is None:
            self.num_unknown += 1
            return None
        parent, token_ids, salt = found
        window = getattr(spec, "sliding_window", None)
        return WireBlockStored(
            [wire_hash(event.block_hash)], None if parent is None else wire_hash(parent),
            token_ids, spec.block_size, None, "GPU", None,
            [[salt]] if salt is not None else None, event.group_id, group_type(spec),
            window)

    # ---- sockets (background thread) -------------------------------------------

    def start(self) -> None:
        """Open the sockets (on the publisher thread); raises what binding raised."""
        self._thread = threading.Thread(target=self._run, name="kv-events-zmq", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self.error is not None:
            raise self.error

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        import zmq

        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        replay = ctx.socket(zmq.ROUTER) if self.config.replay_endpoint else None
        try:
            pub.set_hwm(self.config.hwm)
            _open(pub, self.config.endpoint)
            if replay is not None:
                replay.bind(self.config.replay_endpoint)
        except zmq.ZMQError as err:
            self.error = ValueError(f"--kv-events-config: cannot open {err}")
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(pub, replay)
        finally:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)

    def _loop(self, pub: Any, replay: Any) -> None:
        topic, seq = self.config.topic.encode(), 0
        while True:
            if replay is not None and replay.poll(0):
                self._serve_replay(replay, topic)
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if batch is None:
                return
            payload = encode_batch(batch)
            pub.send_multipart([topic, seq_bytes(seq), payload])
            self._buffer.append((seq, payload))
            self.num_published += 1
            seq += 1

    def _serve_replay(self, replay: Any, topic: bytes) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("ignoring a malformed KV event replay request (%d frames)",
                           len(frames))
            return
        client, start = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                replay.send_multipart([client, b"", topic, seq_bytes(seq), payload])
        replay.send_multipart([client, b"", b"", END_SEQ, b""])


def _open(socket: Any, endpoint: str) -> None:
    """Bind a wildcard or ipc endpoint, connect to the rest (as vLLM does)."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        socket.bind(endpoint)
    else:
        socket.connect(endpoint)
