"""Payload headers and checksums, store keys, layout fingerprints and store URLs."""

import pytest

from hybridkv import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from hybridkv.store import (
    BlockLayout,
    KeySpace,
    PayloadError,
    decode_block,
    encode_block,
    layout_fingerprint,
    open_store,
    parse_size,
    parse_store_url,
)
from hybridkv.store.payload import HEADER_BYTES

FP = b"F" * 16
LAYOUT = BlockLayout(FP, 1, "float32", 3, 8)
KEY = b"hkv1" + FP + b"\x00\x01" + b"h" * 32
DATA = bytes(range(24))


def test_round_trip():
    value = encode_block(LAYOUT, KEY, DATA)
    assert len(value) == HEADER_BYTES + 24
    assert bytes(decode_block(LAYOUT, KEY, value)) == DATA


@pytest.mark.parametrize("pos", range(0, HEADER_BYTES + 24, 5))
def test_any_flipped_byte_is_rejected(pos):
    value = bytearray(encode_block(LAYOUT, KEY, DATA))
    value[pos] ^= 0x40
    with pytest.raises(PayloadError):
        decode_block(LAYOUT, KEY, bytes(value))


def test_truncated_and_garbage_values_are_corrupt():
    value = encode_block(LAYOUT, KEY, DATA)
    for bad in (value[:-1], value[:10], b"", b"not a kv block at all" * 5):
        with pytest.raises(PayloadError) as e:
            decode_block(LAYOUT, KEY, bad)
        assert e.value.reason == "corrupt"


def test_valid_block_under_another_key_is_rejected():
    value = encode_block(LAYOUT, KEY, DATA)
    with pytest.raises(PayloadError, match="checksum"):
        decode_block(LAYOUT, KEY[:-1] + b"x", value)


@pytest.mark.parametrize("other", [
    BlockLayout(b"G" * 16, 1, "float32", 3, 8),  # another model
    BlockLayout(FP, 2, "float32", 3, 8),  # another group
    BlockLayout(FP, 1, "bfloat16", 3, 8),  # another dtype
    BlockLayout(FP, 1, "float32", 2, 12),  # another shape, same byte count
])
def test_other_layouts_are_mismatches(other):
    value = encode_block(other, KEY, DATA)
    with pytest.raises(PayloadError) as e:
        decode_block(LAYOUT, KEY, value)
    assert e.value.reason == "mismatch"


def test_encode_checks_the_data_size():
    with pytest.raises(ValueError, match="23 bytes"):
        encode_block(LAYOUT, KEY, DATA[:-1])


def _config(window=64, block_size=16, names=("a", "b")):
    return KVCacheConfig(8, [
        KVCacheGroupSpec([names[0]], FullAttentionSpec(block_size)),
        KVCacheGroupSpec([names[1]], SlidingWindowSpec(block_size, sliding_window=window))])


def test_fingerprint_covers_model_layout_and_hash_algo_but_not_pool_size():
    base = layout_fingerprint(b"model-1", _config(), "sha256")
    assert len(base) == 16
    assert layout_fingerprint(b"model-1", _config(), "sha256") == base
    import dataclasses
    assert layout_fingerprint(b"model-1", dataclasses.replace(_config(), num_blocks=99),
                              "sha256") == base
    for other in (layout_fingerprint(b"model-2", _config(), "sha256"),
                  layout_fingerprint(b"model-1", _config(window=32), "sha256"),
                  layout_fingerprint(b"model-1", _config(block_size=8), "sha256"),
                  layout_fingerprint(b"model-1", _config(names=("a", "c")), "sha256"),
                  layout_fingerprint(b"model-1", _config(), "xxhash")):
        assert other != base


def test_keys_separate_groups_and_fingerprints():
    a, b = KeySpace(b"A" * 16, 3), KeySpace(b"B" * 16, 3)
    h = b"\x01" * 32
    assert len({a.key(0, h), a.key(1, h), b.key(0, h)}) == 3
    assert a.keys(2, [h, h[:16]]) == [a.key(2, h), a.key(2, h[:16])]
    with pytest.raises(ValueError, match="16 bytes"):
        KeySpace(b"short", 1)


@pytest.mark.parametrize("text,value", [("4GiB", 4 << 30), ("512MiB", 512 << 20),
                                        ("20GB", 20 * 10**9), ("1.5KiB", 1536), ("100", 100),
                                        (" 2 mib ", 2 << 20)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "4XB", "-3GiB", "0", "GiB", "4 GiB GiB"])
def test_bad_sizes_are_named(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_urls():
    assert parse_store_url("cpu://").scheme == "cpu"
    assert parse_store_url("cpu://?size=1GiB").options == {"size": "1GiB"}
    f = parse_store_url("file:///tmp/kv%20store?size=2GiB")
    assert (f.scheme, f.path, f.options) == ("file", "/tmp/kv store", {"size": "2GiB"})
    r = parse_store_url("redis://:secret@10.0.0.2:7000/3?timeout=0.2")
    assert (r.host, r.port, r.db, r.password) == ("10.0.0.2", 7000, 3, "secret")
    assert "secret" not in r.describe()
    d = parse_store_url("redis://localhost")
    assert (d.host, d.port, d.db) == ("localhost", 6379, 0)


@pytest.mark.parametrize("url,match", [
    ("s3://bucket", "unknown scheme 's3'"),
    ("cpu://?size=lots", "cpu size"),
    ("cpu://?sise=1GiB", r"unknown option\(s\) \['sise'\]"),
    ("cpu://host", "no host"),
    ("file://relative/dir", "not host 'relative'"),
    ("file:///tmp/x?size=-1", "file size"),
    ("redis://h:1/zero", "database 'zero'"),
    ("redis://h:99999/0", "bad port"),
    ("redis://h/0?timeout=0", "timeout"),
    ("", "non-empty"),
])
def test_bad_urls_are_named(url, match):
    with pytest.raises(ValueError, match=match):
        open_store(url)


def test_open_cpu_store_and_pass_through():
    s = open_store("cpu://?size=1MiB")
    assert s.stats().capacity_bytes == 1 << 20
    assert open_store(s) is s
