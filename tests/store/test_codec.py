"""The C fast path of the KV tier (hybridkv._native._codec) against its Python reference:
the same stored bytes, the same table contents and order, the same selection of
evicted blocks; bad input raises naming it; without the C module everything works."""

import os
import random
from types import SimpleNamespace

import numpy as np
import pytest

from hybridkv import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.eviction import LOW_VALUE, NORMAL_VALUE, PROTECTED
from hybridkv.store import CpuStore, codec, decode_block
from hybridkv.store.cpu import ENTRY_OVERHEAD
from hybridkv.store.lru import LruDict
from hybridkv.store.payload import BlockLayout, encode_block
from hybridkv.store.selection import RecentSet
from tests.store.sim import SimEngine

C = codec._codec
needs_c = pytest.mark.skipif(C is None, reason=f"hybridkv._native._codec not built: "
                                               f"{codec.EXTENSION_ERROR}")
PREFIX = b"hkv1" + b"F" * 16 + b"\0\1"


def batch(rng, n, layers, layer_bytes):
    data = np.frombuffer(rng.randbytes(layers * n * layer_bytes), dtype=np.uint8)
    return [rng.randbytes(32) for _ in range(n)], data.reshape(layers, n, layer_bytes)


@needs_c
@pytest.mark.parametrize("n, layers, layer_bytes", [(0, 1, 8), (1, 1, 64), (7, 3, 40),
                                                    (33, 2, 1024), (5, 1, 70_000)])
def test_c_encoding_gives_the_reference_bytes(n, layers, layer_bytes):
    rng = random.Random(n * 31 + layers)
    layout = BlockLayout(b"F" * 16, 1, "bfloat16", layers, layer_bytes)
    hashes, data = batch(rng, n, layers, layer_bytes)
    keys = [PREFIX + h for h in hashes]
    got = codec.encode_blocks(layout, keys, data)
    assert got == codec.encode_blocks_raw(layout.header_start, keys, data.tobytes(), layers,
                                          layer_bytes)
    for i, (key, value) in enumerate(zip(keys, got)):
        assert value == encode_block(layout, key, data[:, i].tobytes())  # one block at a time
        assert bytes(decode_block(layout, key, value)) == data[:, i].tobytes()


def test_encoding_checks_its_input():
    layout = BlockLayout(b"F" * 16, 0, "uint8", 2, 8)
    with pytest.raises(ValueError, match="shape"):
        codec.encode_blocks(layout, [b"a"], np.zeros((1, 1, 8), dtype=np.uint8))
    if C is not None:
        with pytest.raises(TypeError, match=r"keys\[1\] is str"):
            C.encode(layout.header_start, [b"a", "b"], bytes(32), 2, 8)
        with pytest.raises(ValueError, match="32 data bytes for 1 blocks"):
            C.encode(layout.header_start, [b"a"], bytes(32), 2, 8)


def tables():
    out = [("python", LruDict)]
    if C is not None:
        out.append(("C", C.LruTable))
    return out


@pytest.mark.parametrize("name, table_class", tables())
def test_batch_puts_store_what_put_of_the_encoded_values_stores(name, table_class):
    """put_encoded, put_from_pages and put of the reference values: the same keys, values,
    order, byte count and evictions (a table small enough to evict)."""
    rng = random.Random(5)
    layout = BlockLayout(b"F" * 16, 1, "uint8", 2, 48)
    entry = len(PREFIX) + 32 + 56 + 2 * 48 + ENTRY_OVERHEAD
    plain, encoded, paged = (table_class(40 * entry, ENTRY_OVERHEAD) for _ in range(3))
    pages = [np.frombuffer(rng.randbytes(300 * 64), dtype=np.uint8).reshape(300, 64)
             for _ in range(2)]  # two layers, rows wider than the 48 data bytes
    for _ in range(12):
        n = rng.randrange(1, 9)
        hashes = [rng.randbytes(32) for _ in range(n)]
        ids = np.array(rng.sample(range(300), n), dtype=np.int64)
        data = np.stack([p[ids, :48] for p in pages])
        keys = [PREFIX + h for h in hashes]
        values = codec.encode_blocks_raw(layout.header_start, keys, data.tobytes(), 2, 48)
        assert plain.put(keys, values) == n
        assert encoded.put_encoded(layout.header_start, PREFIX, hashes, data, 2, 48) == n
        assert paged.put_from_pages(layout.header_start, PREFIX, hashes, ids.tobytes(), pages,
                                    48) == n
        for t in (encoded, paged):
            assert t.keys() == plain.keys() and t.stats() == plain.stats()
        some = rng.sample(plain.keys(), min(3, len(plain.keys())))  # read: refreshed
        assert plain.get(some) == encoded.get(some) == paged.get(some) != []
    assert plain.stats()[2] > 0  # it did evict


@needs_c
def test_c_table_rejects_bad_batches():
    t = C.LruTable(1 << 20, ENTRY_OVERHEAD)
    pages = [np.zeros((10, 8), dtype=np.uint8)]
    with pytest.raises(ValueError, match="block id 10 is not a row of page view 0"):
        t.put_from_pages(b"H" * 48, PREFIX, [b"a"], np.array([10]).tobytes(), pages, 8)
    with pytest.raises(ValueError, match="ids for 2 blocks"):
        t.put_from_pages(b"H" * 48, PREFIX, [b"a", b"b"], np.array([1]).tobytes(), pages, 8)
    with pytest.raises(TypeError, match=r"hashes\[0\] is int"):
        t.put_encoded(b"H" * 48, PREFIX, [5], bytes(8), 1, 8)
    with pytest.raises(TypeError, match=r"values\[0\] is bytearray"):
        t.put([b"k"], [bytearray(b"v")])
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        t.put([b"k", b"j"], [b"v"])
    assert len(t) == 0 and t.stats() == (0, 0, 0)  # nothing half done
    with pytest.raises(RuntimeError, match="not initialized"):
        C.LruTable.__new__(C.LruTable).get([b"k"])


@pytest.mark.parametrize("name, table_class", tables())
def test_queries_with_a_key_prefix_match_queries_with_keys(name, table_class):
    rng = random.Random(2)
    t = table_class(1 << 20, ENTRY_OVERHEAD)
    hashes = [rng.randbytes(32) for _ in range(20)]
    t.put([PREFIX + h for h in hashes[:12]], [b"v"] * 12)
    t.delete([PREFIX + hashes[5]])
    for start in range(0, 20, 3):
        keys = [PREFIX + h for h in hashes[start:]]
        assert t.prefix_length_blocks(PREFIX, hashes[start:]) == t.prefix_length(keys)
        assert t.contains_blocks(PREFIX, hashes[start:]) == t.contains(keys)
    assert t.prefix_length_blocks(PREFIX, hashes) == 5


def random_blocks(rng, n, num_groups, make=Block):
    hints = [LOW_VALUE, NORMAL_VALUE, PROTECTED]
    blocks = []
    for i in range(n):
        b = make(i + 1)
        b.block_hash, b.group_id, b.value_hint = (bytes([rng.randrange(4)]) * 32,
                                                  rng.randrange(num_groups), rng.choice(hints))
        if rng.random() < 0.1:  # cached nothing: passed over
            b.block_hash, b.group_id = None, -1
        blocks.append(b)
    return blocks


def plain_block(block_id):
    return SimpleNamespace(block_id=block_id)


@needs_c
@pytest.mark.parametrize("make", [Block, plain_block])
def test_c_recorder_selects_what_the_reference_selects(make):
    rng = random.Random(9)
    always = [True, False, False]
    tails = [None, ({bytes([1]) * 32}, set()), {bytes([2]) * 32}]
    c_rec = C.EvictionRecorder(always, int(LOW_VALUE), tails)
    py_rec = codec.PyEvictionRecorder(always, int(LOW_VALUE), tails)
    for _ in range(30):
        blocks = random_blocks(rng, rng.randrange(0, 9), 3, make)
        c_rec(blocks)
        py_rec(blocks)
        assert c_rec.num_recorded == py_rec.num_recorded
        if rng.random() < 0.3:
            g = rng.randrange(3)
            assert c_rec.take(g) == py_rec.take(g)
    assert [c_rec.take(g) for g in range(3)] == [py_rec.take(g) for g in range(3)]
    assert c_rec.num_recorded == 0


@needs_c
def test_c_recorder_rejects_bad_blocks():
    rec = C.EvictionRecorder([True], int(LOW_VALUE), [None])
    with pytest.raises(ValueError, match="group id 3 of 1 groups"):
        rec([SimpleNamespace(block_id=1, block_hash=b"h", group_id=3, value_hint=0)])
    with pytest.raises(AttributeError):
        rec([SimpleNamespace(block_id=1, group_id=0, value_hint=0)])
    with pytest.raises(TypeError, match="one argument"):
        rec()
    with pytest.raises(ValueError, match="one tails entry per group"):
        C.EvictionRecorder([True, False], 0, [None])
    assert rec.num_recorded == 0 and rec.take(0) == ([], b"")


def test_the_tier_without_the_c_module_gives_the_same_hits(monkeypatch):
    """The whole tier on the Python fallbacks (recorder, encoding, cpu table): hits,
    stored data and stats as with the C module."""
    specs = [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=10), MambaSpec(4)]
    rng = random.Random(4)
    docs = [[rng.randrange(50) for _ in range(rng.randrange(20, 60))] for _ in range(4)]
    prompts = [rng.choice(docs) + [rng.randrange(50)] for _ in range(30)]

    def run():
        eng = SimEngine(specs, num_blocks=60, store=CpuStore(1 << 22))
        hits = [eng.run(p) for p in prompts]
        eng.tier.flush()
        stats = eng.tier.stats()
        return hits, stats.written_blocks, stats.loaded_blocks, eng.tier.store.keys()

    with_c = run()
    monkeypatch.setattr(codec, "_codec", None)
    assert codec.codec_backend().startswith("python")
    without = run()
    assert without == with_c and with_c[2] > 0


def test_python_encoding_of_a_strided_source():
    """`encode_blocks` copies a non-contiguous gather before encoding."""
    rng = random.Random(1)
    layout = BlockLayout(b"F" * 16, 0, "uint8", 2, 16)
    hashes, data = batch(rng, 6, 2, 32)
    strided = data[:, :, ::2]
    keys = [PREFIX + h for h in hashes]
    got = codec.encode_blocks(layout, keys, strided)
    assert [bytes(decode_block(layout, k, v)) for k, v in zip(keys, got)] == \
        [strided[:, i].tobytes() for i in range(6)]


def test_codec_backend_names_the_path():
    assert codec.codec_backend() == ("C" if C is not None else
                                     f"python ({codec.EXTENSION_ERROR})")
    assert os.path.exists(codec.__file__)


@needs_c
def test_c_tail_set_remembers_what_the_reference_remembers():
    """TailSet (fingerprints in C) against RecentSet: the same members after every
    update, across generations (capacity 40: the older half goes every ~20 items)."""
    rng = random.Random(6)
    pool = [rng.randbytes(32) for _ in range(120)]
    fast, ref = C.TailSet(40), RecentSet(40)
    for _ in range(60):
        items = rng.sample(pool, rng.randrange(0, 8))
        fast.update(items)
        ref.update(items)
        assert [h in fast for h in pool] == [h in ref for h in pool]
    assert 0 < len(fast) <= 40 + 8
    assert b"not a hash" not in fast and 7 not in fast
    with pytest.raises(TypeError, match="item 1 is int"):
        fast.update([b"a", 1])


@needs_c
def test_c_recorder_reads_a_tail_set():
    tails = C.TailSet(1 << 10)
    kept, other = bytes([1]) * 32, bytes([2]) * 32
    tails.update([kept])
    rec = C.EvictionRecorder([False], int(LOW_VALUE), [tails])
    blocks = [SimpleNamespace(block_id=i, block_hash=h, group_id=0, value_hint=LOW_VALUE)
              for i, h in ((1, kept), (2, other))]
    rec(blocks)
    assert rec.take(0) == ([kept], np.array([1], dtype=np.int64).tobytes())
