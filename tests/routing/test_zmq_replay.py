"""ZMQ event sources: gaps recovered from the replay socket, restarts, losses.

A real publisher (`hybridkv serve --kv-events-config`'s) on loopback sends
batches that each store one more block of a chain; the subscriber's frames
are handed to the source with some dropped. The oracle is a view that got
every batch in order.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from types import SimpleNamespace

import pytest
import zmq

from hybridkv.kv_cache.specs import FullAttentionSpec
from hybridkv.serving.kv_events_wire import WireBatch, WireBlockStored, decode_batch
from hybridkv.serving.router.routing import Router
from hybridkv.serving.router.vllm_view import VllmCacheView
from hybridkv.serving.router.zmq_source import (
    EventSource,
    ZmqEventSource,
    event_sources,
    parse_event_source,
)
from hybridkv.serving.zmq_publisher import KvEventsConfig, ZmqKvEventPublisher

URL = "http://127.0.0.1:1"
TOKENS = [random.Random(3).randrange(3, 500) for _ in range(16 * 6)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chain_event(i: int) -> list:
    """Block i of TOKENS (vLLM hash 1000 + i), parent block i - 1."""
    parent = 1000 + i - 1 if i else None
    return [WireBlockStored([1000 + i], parent, TOKENS[16 * i:16 * i + 16], 16, None, "GPU",
                            None, None, 0, "full_attention")]


def start_publisher(endpoint: str, replay: str | None) -> ZmqKvEventPublisher:
    kv = SimpleNamespace(config=SimpleNamespace(specs=[FullAttentionSpec(16)]),
                         hash_algo="sha256", hash_block_size=16)
    config = KvEventsConfig(True, "zmq", endpoint=endpoint, replay_endpoint=replay)
    publisher = ZmqKvEventPublisher(config, kv)
    publisher.start()
    return publisher


def subscribe(endpoint: str):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)  # the subscription reaches the publisher
    return sub


def publish_all(publisher, sub, batches: list[list]) -> list[list[bytes]]:
    for events in batches:
        publisher.send(events)
    frames = []
    while len(frames) < len(batches) and sub.poll(5000):
        frames.append(sub.recv_multipart())
    assert len(frames) == len(batches)
    return frames


def reusable(router: Router, n_blocks: int) -> int:
    return router.explain(TOKENS[:16 * n_blocks] + [1])["backends"][URL]["reusable_tokens"]


@pytest.fixture
def endpoints(tmp_path):
    return f"ipc://{tmp_path}/pub", f"tcp://127.0.0.1:{free_port()}"


def test_a_gap_is_replayed(endpoints):
    pub_ep, replay_ep = endpoints
    publisher = start_publisher(pub_ep, replay_ep)
    sub = subscribe(pub_ep)
    try:
        frames = publish_all(publisher, sub, [chain_event(i) for i in range(5)])
        router = Router("hybrid-prefix")
        source = ZmqEventSource(EventSource(URL, pub_ep, replay_ep),
                                VllmCacheView(URL, router))

        async def feed():
            for i, frame in enumerate(frames):
                if i != 2:  # batch 2 lost on the way
                    await source.receive(frame)
        asyncio.run(feed())
        assert (source.num_gaps, source.num_replayed, source.num_lost) == (1, 1, 0)
        oracle = Router("hybrid-prefix")
        oracle_view = VllmCacheView(URL, oracle)
        for frame in frames:
            oracle_view.apply(decode_batch(frame[2]))
        assert source.view.held == oracle_view.held
        assert reusable(router, 5) == reusable(oracle, 5) == 80
    finally:
        sub.close(linger=0)
        publisher.close()


def test_a_late_joiner_replays_from_zero_and_a_restart_clears(endpoints):
    pub_ep, replay_ep = endpoints
    publisher = start_publisher(pub_ep, replay_ep)
    sub = subscribe(pub_ep)
    router = Router("hybrid-prefix")
    source = ZmqEventSource(EventSource(URL, pub_ep, replay_ep), VllmCacheView(URL, router))
    try:
        frames = publish_all(publisher, sub, [chain_event(i) for i in range(3)])
        asyncio.run(source.receive(frames[-1]))  # joined at seq 2: 0 and 1 replayed
        assert source.num_replayed == 2 and reusable(router, 3) == 48
    finally:
        sub.close(linger=0)
        publisher.close()
    publisher = start_publisher(pub_ep, replay_ep)  # a restarted backend: seq from 0 again
    sub = subscribe(pub_ep)
    try:
        frames = publish_all(publisher, sub, [chain_event(0)])
        asyncio.run(source.receive(frames[0]))
        assert source.num_restarts == 1
        assert reusable(router, 3) == 16  # only what the new process stored
    finally:
        sub.close(linger=0)
        publisher.close()


def test_without_replay_a_gap_clears_the_view(endpoints):
    pub_ep, _ = endpoints
    publisher = start_publisher(pub_ep, None)
    sub = subscribe(pub_ep)
    try:
        frames = publish_all(publisher, sub, [chain_event(0), chain_event(1),
                                              chain_event(2)])
        router = Router("hybrid-prefix")
        source = ZmqEventSource(EventSource(URL, pub_ep), VllmCacheView(URL, router))

        async def feed():
            await source.receive(frames[0])
            await source.receive(frames[2])
        asyncio.run(feed())
        assert source.num_lost == 1
        # block 2's parent was in the lost batch: nothing placed, nothing over-credited
        assert reusable(router, 3) == 0 and source.view.num_unplaced == 1
    finally:
        sub.close(linger=0)
        publisher.close()


def test_replay_request_served_like_vllms(endpoints):
    """The publisher's ROUTER answers vLLM's replay protocol, end marker last."""
    pub_ep, replay_ep = endpoints
    publisher = start_publisher(pub_ep, replay_ep)
    sub = subscribe(pub_ep)
    try:
        publish_all(publisher, sub, [chain_event(i) for i in range(3)])
        source = ZmqEventSource(EventSource(URL, pub_ep, replay_ep),
                                VllmCacheView(URL, Router()))
        got = asyncio.run(source.replay(1))
        assert [seq for seq, _ in got] == [1, 2]
        assert isinstance(decode_batch(got[0][1]), WireBatch)
    finally:
        sub.close(linger=0)
        publisher.close()


@pytest.mark.parametrize("text", ["tcp://h:1", "http://a=", "http://a=redis://x",
                                  "http://a=tcp://h:1,tcp://h:2"])
def test_bad_sources_are_named(text):
    with pytest.raises(ValueError, match="--kv-event-source"):
        parse_event_source(text)


def test_sources_pair_live_and_replay_endpoints():
    got = event_sources(["http://a/=tcp://h:1", "http://b=tcp://h:3"], ["http://a=tcp://h:2"])
    assert got == [EventSource("http://a", "tcp://h:1", "tcp://h:2"),
                   EventSource("http://b", "tcp://h:3")]
    with pytest.raises(ValueError, match="no --kv-event-source"):
        event_sources(["http://a=tcp://h:1"], ["http://c=tcp://h:2"])


def test_config_json_fields_are_checked():
    assert KvEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "zmq", '
                                    '"endpoint": "tcp://*:5557", "topic": "kv"}').enabled
    with pytest.raises(ValueError, match="unknown field"):
        KvEventsConfig.from_json('{"enable_kv_cache_events": true, "endpont": "x"}')
    with pytest.raises(ValueError, match="buffer_steps"):
        KvEventsConfig.from_json('{"buffer_steps": 0}')
