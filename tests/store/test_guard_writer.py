"""The guard around store calls (back-off, one warning per trouble) and the background writer."""

import warnings

import numpy as np
import pytest

from hybridkv import LLM
from hybridkv.store import BlockLayout, CpuStore, StoreError, StoreFull, decode_block
from hybridkv.store.guard import StoreGuard
from hybridkv.store.writer import BackgroundWriter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Broken(CpuStore):
    """Raises `error` on every call while it is set."""

    def __init__(self):
        super().__init__(1 << 20)
        self.error = None
        self.calls = 0

    def get(self, keys):
        self.calls += 1
        if self.error:
            raise self.error
        return super().get(keys)

    def put(self, keys, values):
        self.calls += 1
        if self.error:
            raise self.error
        return super().put(keys, values)


def test_failures_back_off_then_retry_with_one_warning():
    store, clock = Broken(), Clock()
    guard = StoreGuard(store, clock=clock, first_delay=1.0, max_delay=4.0)
    store.put([b"k"], [b"v"])
    store.error = StoreError("down")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert guard.get([b"k"]) == []  # fails: back off 1 s
        assert guard.get([b"k"]) == [] and store.calls == 2  # skipped, store not called
        clock.now = 1.0
        assert guard.get([b"k"]) == [] and store.calls == 3  # retried, fails: 2 s
        clock.now = 2.5
        assert guard.get([b"k"]) == [] and store.calls == 3  # still backing off
        clock.now = 3.0
        store.error = None
        assert guard.get([b"k"]) == [b"v"] and guard.available
    assert guard.errors == 2 and guard.skipped_calls == 2
    assert len([w for w in caught if "failed" in str(w.message)]) == 1


def test_os_errors_count_as_failures_and_delays_are_capped():
    store, clock = Broken(), Clock()
    guard = StoreGuard(store, clock=clock, first_delay=1.0, max_delay=4.0)
    store.error = TimeoutError("timed out")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(6):
            guard.get([b"k"])
            clock.now += 10
    assert guard.errors == 6 and guard._delay == 4.0


def test_a_full_store_drops_writes_and_keeps_reading():
    store, clock = Broken(), Clock()
    guard = StoreGuard(store, clock=clock)
    store.put([b"k"], [b"v"])
    store.error = StoreFull("OOM")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert guard.put([b"x"], [b"y"]) == 0
        assert guard.put([b"x"], [b"y"]) == 0
    store.error = None
    assert guard.available and guard.full_writes == 2 and guard.get([b"k"]) == [b"v"]
    assert len([w for w in caught if "full" in str(w.message)]) == 1


def layout_and_data(n=3, layers=2, nbytes=8):
    layout = BlockLayout(b"F" * 16, 0, "uint8", layers, nbytes)
    data = np.arange(layers * n * nbytes, dtype=np.uint8).reshape(layers, n, nbytes)
    return layout, data


def test_writer_encodes_blocks_readable_before_and_after_writing():
    layout, data = layout_and_data()
    store = CpuStore(1 << 20)
    written = []
    writer = BackgroundWriter(StoreGuard(store), [layout], [b"p:"],
                              lambda *a: written.append(a))
    hashes = [b"a", b"b", b"c"]
    assert writer.submit(0, hashes, data)
    assert writer.read(0, b"b") in (None, data[:, 1].tobytes())  # pending, or written already
    assert writer.flush(10)
    assert not writer.has(0, b"b") and writer.read(0, b"b") is None
    for i, h in enumerate(hashes):
        key = b"p:" + h
        assert bytes(decode_block(layout, key, store.get([key])[0])) == data[:, i].tobytes()
    assert sum(a[1] for a in written) == 3
    writer.close()


def test_writer_drops_past_its_memory_bound():
    layout, data = layout_and_data()
    store = CpuStore(1 << 20)
    writer = BackgroundWriter(StoreGuard(store), [layout], [b""], lambda *a: None,
                              max_pending_bytes=data.nbytes - 1, inline_bytes=0)
    with pytest.warns(RuntimeWarning, match="backlog is full.*dropped_blocks"):
        assert not writer.submit(0, [b"a", b"b", b"c"], data)
    assert writer.dropped_blocks == 3 and writer.flush(10) and store.stats().keys == 0
    writer.close()


def test_engine_kv_store_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown scheme"):
        LLM("gemma3-tiny", kv_store="s3://bucket")
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        LLM("gemma3-tiny", enable_prefix_caching=False, kv_store="cpu://")
    with pytest.raises(ValueError, match="kv_store must be"):
        LLM("gemma3-tiny", kv_store=42)
    with pytest.raises(ValueError, match="selection"):
        LLM("gemma3-tiny", kv_store="cpu://", kv_store_select="some")
    llm = LLM("gemma3-tiny", kv_store=True)
    assert llm.kv_store_stats().url.startswith("cpu://") and LLM("gemma3-tiny").tier is None


@pytest.mark.parametrize("inline_bytes", [0, 1 << 20])
def test_writer_stores_the_same_inline_or_through_its_thread(inline_bytes):
    """Small batches written by the caller (a store without I/O) or queued for the
    thread end up the same in the store; only the inline count differs."""
    rng = np.random.default_rng(3)
    layout = BlockLayout(b"F" * 16, 0, "uint8", 2, 8)
    batches = [([bytes([i, j]) * 16 for j in range(3)],
                rng.integers(0, 255, (2, 3, 8), dtype=np.uint8)) for i in range(5)]
    stores = []
    for inline in (0, inline_bytes):
        store = CpuStore(1 << 20)
        writer = BackgroundWriter(StoreGuard(store), [layout], [b"p:"], lambda *a: None,
                                  inline_bytes=inline)
        for hashes, data in batches:
            assert writer.submit(0, hashes, data)
        assert writer.flush(10)
        assert writer.inline_blocks == (15 if inline else 0)
        writer.close()
        stores.append(store)
    keys = stores[0].keys()
    assert len(keys) == 15 and stores[1].keys() == keys
    assert stores[1].get(keys) == stores[0].get(keys)
