"""Every backend against the same contract: prefix reads, existence queries, deletes,
refreshes and the byte bound; then what is particular to file:// and redis://."""

import os
import subprocess
import sys
import textwrap

import pytest

from hybridkv.store import CpuStore, StoreError, StoreFull, open_store
from hybridkv.store.file import FileStore
from hybridkv.store.redis_store import RedisStore


def k(i):
    return b"key-%05d" % i


def v(i, n=1000):
    return (b"%05d" % i) * (n // 5)


@pytest.fixture(params=["cpu", "file", "redis"])
def make_store(request, tmp_path):
    """A function building a store of the given kind and capacity."""
    if request.param == "cpu":
        return lambda capacity=1 << 24: CpuStore(capacity)
    if request.param == "file":
        return lambda capacity=1 << 24: FileStore(str(tmp_path / "kv"), capacity,
                                                  object_bytes=4000)
    url = request.getfixturevalue("redis_url")
    return lambda capacity=None: open_store(url)


def test_prefix_reads_queries_and_deletes(make_store):
    s = make_store()
    assert s.put([k(i) for i in range(6)], [v(i) for i in range(6)]) == 6
    assert s.get([k(0), k(1), k(2)]) == [v(0), v(1), v(2)]
    assert s.get([k(0), k(99), k(2)]) == [v(0)]
    assert s.get([k(99)]) == [] and s.get([]) == []
    assert s.contains([k(5), k(99), k(0)]) == [True, False, True]
    assert s.prefix_length([k(i) for i in range(6)] + [k(99), k(1)]) == 6
    assert s.prefix_length([k(99)]) == 0
    assert s.delete([k(2), k(99)]) == 1
    assert s.prefix_length([k(i) for i in range(6)]) == 2
    assert s.get([k(3), k(4), k(5)]) == [v(3), v(4), v(5)]
    assert s.stats().keys >= 5
    s.close()


def test_a_key_put_again_keeps_one_copy(make_store):
    s = make_store()
    s.put([k(1)], [v(1)])
    s.put([k(1)], [v(1)])
    assert s.get([k(1)]) == [v(1)]
    assert s.delete([k(1)]) == 1 and s.contains([k(1)]) == [False]


@pytest.mark.parametrize("kind", ["cpu", "file"])
def test_bounded_stores_stay_under_their_size_and_keep_recent_data(kind, tmp_path):
    capacity = 20_000
    s = CpuStore(capacity) if kind == "cpu" else FileStore(str(tmp_path), capacity, 4000)
    for i in range(100):
        s.put([k(i)], [v(i)])
        if kind == "file":
            assert sum(f.stat().st_size for f in tmp_path.iterdir()) <= capacity
        assert s.stats().used_bytes <= capacity + 4000
    s.close()
    present = s.contains([k(i) for i in range(100)])
    assert present[-1] and not present[0]
    assert present[::-1].index(False) > 5  # the newest entries survive together


def test_file_reads_refresh_objects(tmp_path):
    s = FileStore(str(tmp_path), 12_500, object_bytes=4000)  # three objects of 4 blocks
    for i in range(0, 12, 4):
        s.put([k(j) for j in range(i, i + 4)], [v(j) for j in range(i, i + 4)])
    assert len(os.listdir(tmp_path)) == 3
    assert s.get([k(0)]) == [v(0)]  # the oldest object becomes the newest
    s.put([k(j) for j in range(12, 16)], [v(j) for j in range(12, 16)])
    assert s.contains([k(0), k(4), k(8), k(12)]) == [True, False, True, True]


def test_file_store_is_read_by_a_new_process(tmp_path):
    s = FileStore(str(tmp_path), 1 << 24, object_bytes=3000)
    s.put([k(i) for i in range(10)], [v(i) for i in range(10)])
    s.close()  # the last, partly filled object too
    code = textwrap.dedent(f"""
        from hybridkv.store.file import FileStore
        s = FileStore({str(tmp_path)!r}, 1 << 24)
        keys = [b"key-%05d" % i for i in range(10)]
        got = s.get(keys)
        assert got == [(b"%05d" % i) * 200 for i in range(10)], len(got)
        print("ok", s.stats().keys)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "10"]


def test_file_store_drops_damaged_and_unfinished_objects_on_open(tmp_path):
    s = FileStore(str(tmp_path), 1 << 24, object_bytes=3000)
    s.put([k(i) for i in range(9)], [v(i) for i in range(9)])
    s.close()
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".hkvo"))
    assert len(names) == 3
    with open(tmp_path / names[1], "r+b") as f:  # cut the middle object short
        f.truncate(40)
    (tmp_path / ".tmp-left-over.hkvo").write_bytes(b"partial")
    (tmp_path / "garbage.hkvo").write_bytes(b"not an object")
    again = FileStore(str(tmp_path), 1 << 24)
    present = again.contains([k(i) for i in range(9)])
    assert present == [True] * 3 + [False] * 3 + [True] * 3
    assert sorted(os.listdir(tmp_path)) == [names[0], names[2]]
    assert again.get([k(6), k(7), k(8)]) == [v(6), v(7), v(8)]


def test_file_store_errors_are_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cannot use directory"):
        FileStore(str(tmp_path / "file" / "sub"), 1000)
    with pytest.raises(ValueError, match="object_size"):
        FileStore(str(tmp_path), 1000, object_bytes=0)


def test_two_redis_clients_share_blocks_under_a_prefix(redis_url):
    a, b = open_store(redis_url), open_store(redis_url)
    other = open_store(redis_url + "?prefix=other")
    a.put([k(1), k(2)], [v(1), v(2)])
    assert b.get([k(1), k(2)]) == [v(1), v(2)]
    assert other.contains([k(1)]) == [False]


def test_redis_prefix_queries_cross_chunks(redis_url):
    s = open_store(redis_url)
    keys = [k(i) for i in range(100)]
    s.put(keys[:70], [v(i, 10) for i in range(70)])
    assert s.prefix_length(keys) == 70
    assert s.prefix_length(keys[:50]) == 50


def test_full_redis_refuses_writes_and_keeps_reads():
    from tests.store.conftest import RedisServer

    server = RedisServer("--maxmemory", "3mb", "--maxmemory-policy", "noeviction")
    try:
        s = open_store(server.url)
        s.put([k(0)], [v(0)])
        with pytest.raises(StoreFull):
            for i in range(1, 100):
                s.put([k(i)], [v(i, 100_000)])
        assert s.get([k(0)]) == [v(0)]
    finally:
        server.stop()


def test_redis_down_raises_store_error_quickly():
    from tests.store.conftest import free_port

    s = RedisStore("127.0.0.1", free_port(), timeout=0.2)
    for call in (lambda: s.get([k(0)]), lambda: s.put([k(0)], [v(0)]),
                 lambda: s.contains([k(0)]), lambda: s.stats()):
        with pytest.raises(StoreError):
            call()
