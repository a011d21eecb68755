"""The instance registry key (`hybridkv:instance:<id>`) lives only while its
instance heartbeats: a publisher that is killed leaves it to expire."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hybridkv.serving.event_publisher import EventPublisher, instance_key


def _wait(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def test_the_key_outlives_its_ttl_while_the_instance_heartbeats(redis_url, redis_server):
    client = redis_server.client()
    publisher = EventPublisher(redis_url, "beating", {"instance_id": "beating"},
                               ttl_seconds=0.6, heartbeat_seconds=0.15)
    publisher.start()
    try:
        assert _wait(lambda: client.exists(instance_key("beating")), 5)
        assert 0 < client.pttl(instance_key("beating")) <= 600
        time.sleep(1.5)  # well past the TTL: only heartbeats keep it
        assert client.exists(instance_key("beating"))
    finally:
        publisher.close()
    assert not client.exists(instance_key("beating")), "a clean shutdown deletes the key"
    client.close()


def test_the_key_of_a_killed_instance_expires(redis_url, redis_server):
    script = textwrap.dedent(f"""
        import time
        from hybridkv.serving.event_publisher import EventPublisher
        p = EventPublisher({redis_url!r}, "doomed", {{"instance_id": "doomed"}},
                           ttl_seconds=1.0, heartbeat_seconds=0.2)
        p.start()
        print("started", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    client = redis_server.client()
    try:
        assert proc.stdout.readline().strip() == b"started"
        assert _wait(lambda: client.exists(instance_key("doomed")), 5)
        time.sleep(1.5)
        assert client.exists(instance_key("doomed")), "alive: the heartbeat keeps the key"
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        killed = time.monotonic()
        assert _wait(lambda: not client.exists(instance_key("doomed")), 3)
        assert time.monotonic() - killed <= 1.5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        client.close()


def test_a_ttl_must_be_positive(redis_url):
    with pytest.raises(ValueError, match="ttl_seconds"):
        EventPublisher(redis_url, "x", {}, ttl_seconds=0)
