"""The C chain hasher against the pure-Python reference loop, byte for byte.

Oracles: an independent chain written here with struct + hashlib/xxhash, and
`hashing.py` itself with its module-level `_chainhash` patched to None (the
reference path). The C-vs-Python tests FAIL when the extension is not built
(it needs only a C compiler and Python's headers), unless
HYBRIDKV_ALLOW_PYTHON_HASHING=1 says the fallback is intended: then they skip.
The bad-token tests run on whichever paths exist.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
from array import array

import numpy as np
import pytest
import xxhash

from hybridkv.kv_cache import hashing

ALGOS = ("sha256", "xxhash")
BLOCK_SIZES = (1, 16, 64, 256)
MAX_ID = 2**32 - 1
BAD_TOKENS = (-1, 2**32, 2**64, 1.0, 3.5, None, True, False, "7", np.int64(-1))
OPTIONS = (
    {},
    {"cache_salt": "tenant-a"},
    {"lora_name": "adapter-x"},
    {"extra_keys": [("img-0", 5, 40), (b"\x01img-1", 100, 3)]},
    {"cache_salt": b"s", "lora_name": "l", "extra_keys": [("a", 0, 1), ("b", 17, 300)]},
)


@pytest.fixture
def ext():
    """The compiled module; a missing one fails the test unless the fallback is intended."""
    if hashing.EXTENSION_ERROR is not None:
        if os.environ.get(hashing.ALLOW_PYTHON_ENV) == "1":
            pytest.skip(f"C hashing extension not built, {hashing.ALLOW_PYTHON_ENV}=1")
        pytest.fail(f"C hashing extension not built: {hashing.EXTENSION_ERROR} "
                    f"(set {hashing.ALLOW_PYTHON_ENV}=1 if the fallback is intended)")
    module = hashing._chainhash
    assert module is not None, "hashing.py does not use the built extension"
    return module


def _digest(algo: str, data: bytes) -> bytes:
    if algo == "sha256":
        return hashlib.sha256(data).digest()
    return xxhash.xxh3_128_digest(data)


def _oracle_chain(algo, parent, tokens, first, num_blocks, block_size, extra):
    """The chain format, written independently of hashing.py."""
    out = []
    for k in range(num_blocks):
        lo = first + k * block_size
        parent = _digest(algo, parent + struct.pack(f"<{block_size}I", *tokens[lo:lo + block_size])
                         + extra)
        out.append(parent)
    return out


def _tokens(n: int, seed: int) -> list[int]:
    """n random ids with both ends of the uint32 range mixed in."""
    rng = random.Random(seed)
    toks = [rng.randrange(2**32) for _ in range(n)]
    for i in range(0, n, 7):
        toks[i] = 0 if i % 2 else MAX_ID
    return toks


def _both_paths(monkeypatch, tokens, block_size, **kw):
    fast = hashing.compute_block_hashes(tokens, block_size, **kw)
    with monkeypatch.context() as m:
        m.setattr(hashing, "_chainhash", None)
        ref = hashing.compute_block_hashes(tokens, block_size, **kw)
    return fast, ref


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("extra", [b"", b"L\x03\x00\x00\x00abc"])
def test_chain_matches_oracle(ext, algo, block_size, extra):
    tokens = _tokens(block_size * 5 + 3, seed=block_size)
    parent = hashing.seed_hash(algo)
    got = ext.chain(hashing._ALGO_IDS[algo], parent, tokens, 2, 5, block_size, extra)
    assert got == _oracle_chain(algo, parent, tokens, 2, 5, block_size, extra)
    assert ext.chain(hashing._ALGO_IDS[algo], parent, tuple(tokens), 2, 5, block_size, extra) == got


# (parent bytes, block size, extra bytes): total lengths 4, 9, 16, 20, 52, 56, 64, 80, 144,
# 240, 272, 1040 and 2064 reach every XXH3-128 length class (4-8, 9-16, 17-128, 129-240,
# one and several 1024-byte blocks) and both sides of SHA-256's 55/56/64-byte padding edges.
@pytest.mark.parametrize("parent_len,block_size,extra_len", [
    (0, 1, 0), (0, 1, 5), (0, 4, 0), (16, 1, 0), (32, 5, 0), (32, 6, 0), (32, 8, 0),
    (16, 16, 0), (16, 32, 0), (16, 50, 24), (16, 64, 0), (16, 256, 0), (16, 512, 0),
])
@pytest.mark.parametrize("algo", ALGOS)
def test_chain_every_input_length_class(ext, algo, parent_len, block_size, extra_len):
    tokens = _tokens(block_size * 3, seed=parent_len + block_size)
    parent, extra = bytes(range(parent_len)), b"x" * extra_len
    got = ext.chain(hashing._ALGO_IDS[algo], parent, tokens, 0, 3, block_size, extra)
    assert got == _oracle_chain(algo, parent, tokens, 0, 3, block_size, extra)


@pytest.mark.parametrize("algo", ALGOS)
def test_chain_cached_equals_chain(ext, algo):
    """The memoized chain (requests' hashers) returns chain()'s digests, hashed or from the
    memo: inputs repeated, more of them than the memo holds (slots replaced), and inputs
    one byte away from a memoized one (parent, token or extra)."""
    ext.clear_memo()
    algo_id, rng = hashing._ALGO_IDS[algo], random.Random(5)
    cases = []
    for i in range(12000):
        block_size = rng.choice((1, 4, 16, 64))
        tokens = _tokens(block_size * 3, seed=i % 400)
        parent = hashing.seed_hash(algo) if i % 3 else bytes([i % 5]) * 32
        cases.append((parent, tokens, block_size, rng.choice((b"", b"L\x01\x00\x00\x00a"))))
    for parent, tokens, block_size, extra in cases + cases[::-1]:
        want = ext.chain(algo_id, parent, tokens, 0, 3, block_size, extra)
        assert ext.chain_cached(algo_id, parent, tokens, 0, 3, block_size, extra) == want
    parent, tokens, block_size, extra = cases[-1]
    memoized = ext.chain_cached(algo_id, parent, tokens, 0, 3, block_size, extra)
    for changed in ((bytes([parent[0] ^ 1]) + parent[1:], tokens, extra),
                    (parent, tokens[:-1] + [tokens[-1] ^ 1], extra),
                    (parent, tokens, extra + b"!")):
        got = ext.chain_cached(algo_id, changed[0], changed[1], 0, 3, block_size, changed[2])
        assert got == _oracle_chain(algo, changed[0], changed[1], 0, 3, block_size, changed[2])
        assert got[-1] != memoized[-1]
    if algo == "sha256":  # the memo hands out the digest objects it holds
        again = ext.chain_cached(algo_id, parent, tokens, 0, 3, block_size, extra)
        assert all(a is b for a, b in zip(again, memoized))


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "salt", "lora", "mm", "all"])
def test_compute_block_hashes_c_equals_python(ext, monkeypatch, algo, block_size, options):
    tokens = _tokens(block_size * 9 + block_size // 2, seed=7 * block_size)
    fast, ref = _both_paths(monkeypatch, tokens, block_size, hash_algo=algo, **options)
    assert len(ref) == 9
    assert fast == ref


@pytest.mark.parametrize("algo", ALGOS)
def test_plain_hashes_match_oracle_on_both_paths(monkeypatch, algo):
    tokens = _tokens(16 * 4, seed=3)
    want = _oracle_chain(algo, hashing.seed_hash(algo), tokens, 0, 4, 16, b"")
    fast, ref = _both_paths(monkeypatch, tokens, 16, hash_algo=algo)
    assert fast == ref == want


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kw", [
    {"cache_salt": "s", "lora_name": "l"},
    {"cache_salt": "s", "lora_name": "l", "mm_items": [("m", 20, 50), ("n", 150, 4)]},
], ids=["salt-lora", "salt-lora-mm"])
def test_incremental_extend_c_equals_python(ext, monkeypatch, algo, kw):
    tokens = _tokens(16 * 12, seed=11)
    fast = hashing.BlockHasher(algo, 16, **kw)
    for end in (5, 40, 41, 100, 160, 192):
        fast.extend(tokens[:end])
    with monkeypatch.context() as m:
        m.setattr(hashing, "_chainhash", None)
        ref = hashing.BlockHasher(algo, 16, **kw).extend(tokens)
    assert fast.hashes == ref


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("make", [tuple, lambda t: array("I", t), lambda t: np.asarray(t, np.int64),
                                  lambda t: [np.uint32(x) for x in t]],
                         ids=["tuple", "array", "ndarray", "numpy-ints"])
def test_other_sequences_hash_like_lists(ext, monkeypatch, algo, make):
    tokens = _tokens(16 * 6, seed=5)
    want = hashing.compute_block_hashes(tokens, 16, hash_algo=algo, extra_keys=[("m", 30, 9)])
    fast, ref = _both_paths(monkeypatch, make(tokens), 16, hash_algo=algo,
                            extra_keys=[("m", 30, 9)])
    assert fast == ref == want


def _bad_token_error(tokens, algo, **kw):
    hasher = hashing.BlockHasher(algo, 16, **kw)
    with pytest.raises(ValueError, match="token_ids: token id") as info:
        hasher.extend(tokens)
    assert hasher.hashes == []  # nothing half-hashed
    return str(info.value)


@pytest.mark.parametrize("bad", BAD_TOKENS, ids=repr)
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kw", [{}, {"mm_items": [("m", 16, 16)]}], ids=["one-run", "three-runs"])
def test_bad_token_raises_same_error_on_both_paths(monkeypatch, algo, bad, kw):
    tokens = _tokens(16 * 6, seed=2)
    tokens[16 * 4 + 3] = bad  # in the last run: earlier runs must not be kept either
    msg = f"token_ids: token id {bad!r} is not an int in [0, 2**32)"
    assert _bad_token_error(tokens, algo, **kw) == msg
    with monkeypatch.context() as m:
        m.setattr(hashing, "_chainhash", None)
        assert _bad_token_error(tokens, algo, **kw) == msg


def test_bad_token_in_partial_block_is_not_read(monkeypatch):
    tokens = [1] * 16 + [None]  # the 17th token is not in a full block yet
    fast, ref = _both_paths(monkeypatch, tokens, 16)
    assert fast == ref and len(fast) == 1


def test_first_bad_token_is_named(ext):
    tokens = [5] * 15 + [-3, 2**40]
    with pytest.raises(ValueError, match=r"token id -3 is"):
        ext.chain(0, b"", tokens, 1, 1, 16, b"")


@pytest.mark.parametrize("args,match", [
    ((2, b"", [1] * 4, 0, 1, 4, b""), "algo_id"),
    ((0, b"", [1] * 4, 0, 1, 0, b""), "block_size"),
    ((0, b"", [1] * 4, -1, 1, 4, b""), "first_token"),
    ((0, b"", [1] * 4, 1, 1, 4, b""), "exceed"),
    ((0, b"", [1] * 8, 0, 3, 4, b""), "exceed"),
])
def test_chain_rejects_bad_ranges(ext, args, match):
    with pytest.raises(ValueError, match=match):
        ext.chain(*args)


def test_chain_zero_blocks_and_type_errors(ext):
    assert ext.chain(1, b"p", [], 0, 0, 16, b"") == []
    with pytest.raises(TypeError):
        ext.chain(0, b"", 5, 0, 1, 1, b"")
    with pytest.raises(TypeError):
        ext.chain(0, "parent", [1], 0, 1, 1, b"")


def test_index_that_shrinks_the_list_is_refused(ext):
    class Shrinker:
        def __index__(self):
            tokens.clear()
            return 1

    tokens = [Shrinker()] + [2] * 31
    with pytest.raises(RuntimeError, match="changed"):
        ext.chain(0, b"", tokens, 0, 2, 16, b"")


class _IndexRaises:
    def __init__(self, error):
        self.error = error

    def __index__(self):
        raise self.error

    def __repr__(self):
        return "IndexRaises"


@pytest.mark.parametrize("error,expected", [(TypeError("no"), ValueError),
                                            (ZeroDivisionError("boom"), ZeroDivisionError)])
def test_index_errors_surface_alike_on_both_paths(monkeypatch, error, expected):
    tokens = [3] * 20 + [_IndexRaises(error)] + [4] * 11
    with pytest.raises(expected):
        hashing.compute_block_hashes(tokens, 16)
    with monkeypatch.context() as m:
        m.setattr(hashing, "_chainhash", None)
        with pytest.raises(expected):
            hashing.compute_block_hashes(tokens, 16)


@pytest.mark.parametrize("make", [list, tuple, lambda t: [np.int64(x) for x in t]],
                         ids=["list", "tuple", "numpy-ints"])
def test_max_token_id_is_max_on_both_paths(monkeypatch, make):
    for n in (1, 2, 17, 2080):
        tokens = _tokens(n, seed=n)
        tokens[n // 2] = MAX_ID if n > 2 else tokens[n // 2]
        assert hashing.max_token_id(make(tokens)) == max(tokens)
        with monkeypatch.context() as m:
            m.setattr(hashing, "_max_token", None)
            m.setattr(hashing, "_chainhash", None)
            assert hashing.max_token_id(make(tokens)) == max(tokens)


@pytest.mark.parametrize("bad", BAD_TOKENS, ids=repr)
def test_max_token_id_names_a_bad_token_on_both_paths(monkeypatch, bad):
    tokens = _tokens(40, seed=3)
    tokens[25] = bad
    msg = f"token_ids: token id {bad!r} is not an int in [0, 2**32)"
    for patched in (False, True):
        with monkeypatch.context() as m:
            if patched:
                m.setattr(hashing, "_max_token", None)
                m.setattr(hashing, "_chainhash", None)
            with pytest.raises(ValueError) as err:
                hashing.max_token_id(tokens)
            assert str(err.value) == msg
            with pytest.raises(ValueError, match="no tokens"):
                hashing.max_token_id([])


def test_max_token_refuses_a_list_changed_while_read(ext):
    class Shrinker:
        def __index__(self):
            tokens.clear()
            return 1

    tokens = [2] * 5 + [Shrinker()] + [3] * 10
    with pytest.raises(RuntimeError, match="changed"):
        ext.max_token(tokens)
