"""Chained block hashing.

`h[i] = H(h[i-1] or SEED, tokens of block i, extra keys of block i)`, one
hash per FULL block. The bytes hashed for block i are

    parent digest || tokens as little-endian uint32 || extra

where `extra` is empty unless the block carries extra keys, each written as a
tag byte, a little-endian uint32 length and the bytes (`S` cache_salt, first
block only; `L` LoRA name, every block; `M` a multimodal item overlapping the
block: its hash followed by its start offset as little-endian int64). Parent
and token fields have fixed widths, so the encoding is unambiguous.

SEED is the algorithm's digest of a fixed string: hashes agree across
processes and machines and never depend on Python's hash seed. `sha256` is
the default (collision resistant: a forged collision would hand one tenant
another's KV); `xxhash` (XXH3 128-bit) is the fast option.

A C accelerator (`hybridkv._native._chainhash`, built with the package; it
needs only a C compiler and Python's headers) hashes runs of blocks that share
one `extra`; the pure Python loop below is the reference it must match byte
for byte. When it was not built, the first hash computed warns once
(`RuntimeWarning`, naming the reason) unless `HYBRIDKV_ALLOW_PYTHON_HASHING=1`
says the fallback is intended; `hashing_backend()` reports which path runs.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import warnings
from array import array
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import xxhash

from hybridkv.kv_cache.checks import check_int
from hybridkv.kv_cache.extensions import load_extension
from hybridkv.kv_cache.fastpath import native as _fastpath

ALLOW_PYTHON_ENV = "HYBRIDKV_ALLOW_PYTHON_HASHING"
_chainhash, EXTENSION_ERROR = load_extension("hybridkv._native._chainhash")
_chain: Any = getattr(_chainhash, "chain", None)
# (a build older than this module has no memo: requests' hashers use chain)
_chain_cached: Any = getattr(_chainhash, "chain_cached", _chain)
# (None with a build older than this module: the checks then run in Python)
_max_token = getattr(_chainhash, "max_token", None)
_warned_fallback = False


class HashingBackend(NamedTuple):
    """Which hashing path runs: the C extension (and its SHA-256 code) or Python."""

    c_extension: bool
    sha256: str  # "sha-ni", "portable" (C) or "hashlib" (Python)
    reason: str | None  # why the C extension is missing, else None

    def describe(self) -> str:
        if self.c_extension:
            return f"C extension (sha256: {self.sha256}, xxhash: vendored XXH3)"
        return f"pure Python fallback, ~7x slower (C extension not built: {self.reason})"


def hashing_backend() -> HashingBackend:
    """The hashing path of this process (the built extension, or why not)."""
    if _chainhash is None:
        return HashingBackend(False, "hashlib", EXTENSION_ERROR or "disabled")
    backend = getattr(_chainhash, "sha256_backend", None)
    return HashingBackend(True, backend() if backend else "C", None)


def _warn_fallback() -> None:
    """Warn once that the C extension is missing (not when it was disabled on purpose)."""
    global _warned_fallback
    if _warned_fallback or EXTENSION_ERROR is None:
        return
    _warned_fallback = True
    if os.environ.get(ALLOW_PYTHON_ENV) == "1":
        return
    warnings.warn(f"hybridkv: C hashing extension not built ({EXTENSION_ERROR}); hashing "
                  f"falls back to pure Python, ~7x slower. Reinstall with a C compiler and "
                  f"Python headers, or set {ALLOW_PYTHON_ENV}=1 if this is intended.",
                  RuntimeWarning, stacklevel=2)


HASH_ALGOS = ("sha256", "xxhash")
_ALGO_IDS = {"sha256": 0, "xxhash": 1}  # the ids chain() takes (the C reads them here)
if _chainhash is not None:
    _chainhash.configure(_ALGO_IDS)
_SEED_TEXT = b"hybridkv/block-hash/v1"

BlockHash = bytes
MultiModalItem = tuple[str | bytes, int, int]  # (content hash, start offset, length)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


_DIGESTS: dict[str, Callable[[bytes], bytes]] = {
    "sha256": _sha256,
    "xxhash": xxhash.xxh3_128_digest,
}


def check_hash_algo(hash_algo: object) -> str:
    """Return `hash_algo` if supported, else raise ValueError naming it."""
    if not isinstance(hash_algo, str) or hash_algo not in _DIGESTS:
        raise ValueError(f"hash_algo: unknown algorithm {hash_algo!r}; use one of {HASH_ALGOS}")
    return hash_algo


def seed_hash(hash_algo: str) -> BlockHash:
    """The fixed parent of block 0."""
    return _SEEDS[check_hash_algo(hash_algo)]


_SEEDS = {algo: digest(_SEED_TEXT) for algo, digest in _DIGESTS.items()}


def _field(tag: bytes, data: bytes) -> bytes:
    return tag + struct.pack("<I", len(data)) + data


def _as_bytes(name: str, value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise ValueError(f"{name} must be str or bytes, got {type(value).__name__}")


def _first_bad_token(token_ids: Sequence[int], limit: int = 2**32) -> object:
    """The first token id that is not an int in [0, `limit`) (None if there is none)."""
    return next((t for t in token_ids
                 if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < limit), None)


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Tokens as little-endian uint32; ValueError for ids outside [0, 2**32)."""
    try:
        packed = array("I", token_ids)
    except (OverflowError, TypeError) as e:
        bad = _first_bad_token(token_ids)
        raise ValueError(f"token_ids: token id {bad!r} is not an int in [0, 2**32)") from e
    if packed.itemsize != 4:  # pragma: no cover - platforms with 2-byte unsigned int
        packed = array("L", token_ids)
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


def check_mm_items(mm_items: Sequence[MultiModalItem] | None) -> tuple[MultiModalItem, ...]:
    """Validate multimodal items as (hash, offset, length) triples, sorted by offset."""
    if not mm_items:
        return ()
    out = []
    for item in mm_items:
        if not (isinstance(item, tuple | list) and len(item) == 3):
            raise ValueError(f"mm_hashes: each item must be (hash, offset, length), got {item!r}")
        h, offset, length = item
        _as_bytes("mm_hashes hash", h)
        check_int("mm_hashes: offset", offset, 0)
        check_int("mm_hashes: length", length, 1)
        out.append((h, offset, length))
    return tuple(sorted(out, key=lambda it: it[1]))


class BlockHasher:
    """Hashes the blocks of one token stream (one request), incrementally.

    Holds the request's keys (salt, LoRA, multimodal items); `extend` hashes
    the full blocks not hashed yet and appends them to `hashes`. `memo=True`
    (requests' hashers) takes SHA-256 block digests from the C extension's
    bounded memo of recently hashed blocks when the same block (same parent,
    tokens and keys) was hashed before: same digests, computed once per
    shared prefix (see `_hashmemo.h`).
    """

    __slots__ = ("hash_algo", "block_size", "hashes", "_lora", "_salt", "_mm", "_digest",
                 "_chain")

    def __init__(self, hash_algo: str, block_size: int, *, cache_salt: str | bytes | None = None,
                 lora_name: str | None = None,
                 mm_items: Sequence[MultiModalItem] | None = None, memo: bool = False) -> None:
        self._chain = _chain_cached if memo else _chain
        # (the checks inline for the usual arguments: one hasher per request)
        self.hash_algo = hash_algo if type(hash_algo) is str and hash_algo in _DIGESTS \
            else check_hash_algo(hash_algo)
        if type(block_size) is not int or block_size < 1:
            check_int("block_size", block_size, 1)
        self.block_size = block_size
        self.hashes: list[BlockHash] = []
        self._digest = _DIGESTS[hash_algo]
        self._salt = (b"" if cache_salt is None
                      else _field(b"S", _as_bytes("cache_salt", cache_salt)))
        self._lora = b"" if lora_name is None else _field(b"L", _as_bytes("lora_name", lora_name))
        self._mm = check_mm_items(mm_items) if mm_items else ()

    def extend(self, token_ids: Sequence[int]) -> list[BlockHash]:
        """Hash every full block of `token_ids` not hashed yet; return all hashes."""
        first = len(self.hashes)
        last = len(token_ids) // self.block_size
        if last > first:
            self._hash_range(token_ids, first, last)
        return self.hashes

    def _extra(self, i: int) -> bytes:
        extra = self._salt if i == 0 else b""
        extra += self._lora
        if self._mm:
            start, end = i * self.block_size, (i + 1) * self.block_size
            for h, offset, length in self._mm:
                if offset < end and offset + length > start:
                    extra += _field(b"M", _as_bytes("mm hash", h) + struct.pack("<q", offset))
        return extra

    def _hash_range(self, token_ids: Sequence[int], first: int, last: int) -> None:
        """Hash blocks first..last-1; on a bad token raise before adding any hash."""
        bs = self.block_size
        tokens: Sequence[int] | bytes
        if _chainhash is None:  # reference path: validate and pack everything first
            _warn_fallback()
            tokens, base = self._pack(token_ids[first * bs:last * bs]), first
        elif isinstance(token_ids, (list, tuple)):  # C reads the ints in place
            tokens, base = token_ids, 0
        else:
            tokens, base = list(token_ids[first * bs:last * bs]), first
        parent = self.hashes[-1] if self.hashes else _SEEDS[self.hash_algo]
        if _chainhash is not None and not self._mm and not (first == 0 and self._salt):
            # every block's extra is the LoRA key: one call, no run splitting
            self.hashes.extend(self._chain(_ALGO_IDS[self.hash_algo], parent, tokens,
                                                (first - base) * bs, last - first, bs, self._lora))
            return
        out: list[BlockHash] = []
        i = first
        while i < last:
            j = self._run_end(i, last)
            parent = self._hash_run(parent, tokens, base, i, j, out)
            i = j
        self.hashes.extend(out)

    @staticmethod
    def _pack(token_ids: Sequence[int]) -> bytes:
        """`pack_tokens`, also refusing bools (which `array` would take as 0/1)."""
        data = pack_tokens(token_ids)
        if bool in set(map(type, token_ids)):
            bad = next(t for t in token_ids if isinstance(t, bool))
            raise ValueError(f"token_ids: token id {bad!r} is not an int in [0, 2**32)")
        return data

    def _run_end(self, i: int, last: int) -> int:
        """End of the run of blocks from i whose extra equals block i's."""
        if i == 0 and self._salt:
            return 1
        if not self._mm:
            return last
        extra = self._extra(i)
        j = i + 1
        while j < last and self._extra(j) == extra:
            j += 1
        return j

    def _hash_run(self, parent: bytes, tokens: Sequence[int] | bytes, base: int, i: int, j: int,
                  out: list[BlockHash]) -> bytes:
        """Append the hashes of blocks i..j-1 (one shared extra) to `out`; return the last.

        `tokens` starts at block `base`: the token ids on the C path, their
        packed bytes on the Python path.
        """
        extra = self._extra(i)
        bs = self.block_size
        if _chainhash is not None:
            hashes = self._chain(_ALGO_IDS[self.hash_algo], parent, tokens, (i - base) * bs,
                                      j - i, bs, extra)
            out.extend(hashes)
            return hashes[-1]
        assert isinstance(tokens, bytes), "the Python path hashes packed tokens"
        digest, append, step = self._digest, out.append, bs * 4
        for k in range(i - base, j - base):
            parent = digest(parent + tokens[k * step:(k + 1) * step] + extra)
            append(parent)
        return parent


def compute_block_hashes(token_ids: Sequence[int], block_size: int, *, hash_algo: str = "sha256",
                         cache_salt: str | bytes | None = None, lora_name: str | None = None,
                         extra_keys: Sequence[MultiModalItem] | None = None) -> list[BlockHash]:
    """One chained hash per full block of `token_ids`.

    `extra_keys` are multimodal items `(content hash, start offset, length)`:
    every block that overlaps an item is keyed by its hash and offset.
    Raises ValueError for an unknown `hash_algo`, a bad block size, token ids
    outside [0, 2**32) or malformed extra keys.

    >>> len(compute_block_hashes(list(range(40)), 16))
    2
    """
    if _chainhash is not None and cache_salt is None and lora_name is None and not extra_keys \
            and type(token_ids) is list and type(block_size) is int and block_size > 0 \
            and hash_algo in _ALGO_IDS:  # the common case in one C call
        return _chainhash.chain(_ALGO_IDS[hash_algo], _SEEDS[hash_algo], token_ids, 0,
                                len(token_ids) // block_size, block_size, b"")
    hasher = BlockHasher(hash_algo, block_size, cache_salt=cache_salt, lora_name=lora_name,
                         mm_items=extra_keys)
    return list(hasher.extend(token_ids))


def check_token_ids(token_ids: Sequence[int], vocab_size: int | None = None) -> None:
    """Raise ValueError naming the first token id that is not an int in [0, 2**32),
    or in [0, `vocab_size`) when given: the one check of token ids (`Request`
    runs it on every prompt and appended output)."""
    if not token_ids:
        return
    try:
        top = max_token_id(token_ids)
    except ValueError:
        if vocab_size is None:
            raise
        top = vocab_size  # named below as outside the vocabulary
    if vocab_size is not None and top >= vocab_size:
        bad = _first_bad_token(token_ids, vocab_size)
        raise ValueError(f"token_ids: token id {bad!r} is outside the vocabulary "
                         f"[0, {vocab_size})")


def max_token_id(token_ids: Sequence[int]) -> int:
    """The largest token id, checking every one is an int in [0, 2**32) on the way
    (ValueError naming the first that is not, also for no tokens)."""
    if _max_token is not None and type(token_ids) is list:
        return _max_token(token_ids)  # reads every token as chain() does (~1 ns per token)
    if not token_ids:
        raise ValueError("token_ids: max of no tokens")
    BlockHasher._pack(token_ids)
    return max(token_ids)


if _fastpath is not None and getattr(_chainhash, "_C_API", None) is not None:
    # requests' hashes extend in C, straight through the hashing extension's C API
    _fastpath.configure_hashing(BlockHasher, _chainhash._C_API, _ALGO_IDS, _SEEDS)
