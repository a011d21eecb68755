"""What a router needs to know of a backend's KV cache: its groups and hash.

A backend describes its cache as JSON (served at `GET /v1/kv_cache_layout`
and written next to its event stream)::

    {"instance_id": "a", "url": "http://127.0.0.1:8001", "model": "gemma3-tiny",
     "hash_algo": "sha256",
     "groups": [{"type": "full", "block_size": 16},
                {"type": "sliding_window", "block_size": 16, "sliding_window": 64,
                 "num_sink_tokens": 0}]}

Group types: `full`, `sink_full` (`sink_len`), `sliding_window`
(`sliding_window`, `num_sink_tokens`), `chunked_local` (`attention_chunk_size`),
`mamba` (`hybridkv serve` writes `full_attention`, `sink_full_attention`,
`chunked_local_attention`: the same types). The router keys nothing by
layer: groups whose reuse rule is the same
(same type, block size and rule parameters) form one `ReuseClass`, and a hash
counts as cached in a class on an instance when every group of the class
caches it there (the rules only ask "are all these blocks cached", so this
gives the same answer as asking each group).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridkv.kv_cache.hashing import check_hash_algo
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

# rule kinds: which blocks before a hit length L must be cached
CHAIN = "chain"  # all of them (full attention, sink full attention)
WINDOW = "window"  # the last `window` ones (and the first `sinks`)
CHUNK = "chunk"  # those since the start of L's chunk
STATE = "state"  # the one ending at L (Mamba)

_TYPE_NAMES: dict[type[KVCacheSpec], str] = {
    FullAttentionSpec: "full",
    SinkFullAttentionSpec: "sink_full",
    SlidingWindowSpec: "sliding_window",
    ChunkedLocalAttentionSpec: "chunked_local",
    MambaSpec: "mamba",
}


_ALIASES = {"full_attention": "full", "sink_full_attention": "sink_full",
            "chunked_local_attention": "chunked_local"}


@dataclass(frozen=True)
class ReuseClass:
    """Groups sharing one reuse rule.

    `stride`: the group block size in hash blocks (a group block i is keyed
    by hash `(i + 1) * stride - 1`). `window` and `sinks` (WINDOW) and
    `chunk` (CHUNK) are in group blocks.
    """

    kind: str
    block_size: int
    stride: int
    window: int = 0
    sinks: int = 0
    chunk: int = 0


@dataclass(frozen=True)
class CacheLayout:
    """The groups of one backend's KV cache and how its prompts are hashed."""

    specs: tuple[KVCacheSpec, ...]
    hash_algo: str = "sha256"

    def __post_init__(self) -> None:
        check_hash_algo(self.hash_algo)
        if not self.specs:
            raise ValueError("CacheLayout.specs must not be empty")
        for spec in self.specs:
            if type(spec) not in _TYPE_NAMES:
                raise ValueError(f"CacheLayout: unsupported spec {spec!r}")

    @property
    def hash_block_size(self) -> int:
        """Prompts are hashed at the gcd of the group block sizes."""
        return math.gcd(*(s.block_size for s in self.specs))

    @property
    def alignment(self) -> int:
        """Hits are multiples of the lcm of the group block sizes."""
        return math.lcm(*(s.block_size for s in self.specs))

    @property
    def key(self) -> tuple:
        """Equal keys: the same cached hashes mean the same reusable prefixes."""
        return (self.hash_algo, tuple(tuple(sorted(_spec_to_json(s).items()))
                                      for s in self.specs))

    def reuse_classes(self) -> tuple[list[ReuseClass], list[int]]:
        """(the distinct rules, the class index of every group)."""
        classes: list[ReuseClass] = []
        group_class: list[int] = []
        for spec in self.specs:
            rule = _reuse_class(spec, self.hash_block_size)
            if rule not in classes:
                classes.append(rule)
            group_class.append(classes.index(rule))
        return classes, group_class

    @classmethod
    def from_config(cls, config: KVCacheConfig, hash_algo: str = "sha256") -> CacheLayout:
        return cls(tuple(config.specs), hash_algo)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> CacheLayout:
        """Parse a backend's layout JSON; ValueError names a bad field."""
        if not isinstance(body, Mapping):
            raise ValueError(f"cache layout must be a JSON object, got {type(body).__name__}")
        groups = body.get("groups")
        if not isinstance(groups, list) or not groups:
            raise ValueError(f"cache layout 'groups' must be a non-empty list, got {groups!r}")
        specs = tuple(_spec_from_json(i, g) for i, g in enumerate(groups))
        return cls(specs, body.get("hash_algo", "sha256"))

    def to_json(self) -> dict[str, Any]:
        """The `hash_algo` and `groups` fields of a layout JSON."""
        return {"hash_algo": self.hash_algo, "groups": [_spec_to_json(s) for s in self.specs]}


def _reuse_class(spec: KVCacheSpec, hash_block_size: int) -> ReuseClass:
    bs = spec.block_size
    stride = bs // hash_block_size
    if isinstance(spec, SlidingWindowSpec):
        return ReuseClass(WINDOW, bs, stride, window=spec.num_window_blocks,
                          sinks=spec.num_sink_blocks)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return ReuseClass(CHUNK, bs, stride, chunk=spec.attention_chunk_size // bs)
    if isinstance(spec, MambaSpec):
        return ReuseClass(STATE, bs, stride)
    return ReuseClass(CHAIN, bs, stride)


def layout_json(config: KVCacheConfig, hash_algo: str, **fields: Any) -> dict[str, Any]:
    """A backend's layout JSON for `config` (plus `instance_id`, `url`, `model`...)."""
    return {**fields, **CacheLayout.from_config(config, hash_algo).to_json()}


def _spec_to_json(spec: KVCacheSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _TYPE_NAMES[type(spec)], "block_size": spec.block_size}
    if isinstance(spec, SlidingWindowSpec):
        out.update(sliding_window=spec.sliding_window, num_sink_tokens=spec.num_sink_tokens)
    elif isinstance(spec, ChunkedLocalAttentionSpec):
        out["attention_chunk_size"] = spec.attention_chunk_size
    elif isinstance(spec, SinkFullAttentionSpec):
        out["sink_len"] = spec.sink_len
    return out


def _spec_from_json(i: int, raw: object) -> KVCacheSpec:
    if not isinstance(raw, Mapping):
        raise ValueError(f"cache layout groups[{i}] must be an object, got {raw!r}")
    group: Any = raw  # field types are checked by the spec classes
    kind = _ALIASES.get(group.get("type"), group.get("type"))
    bs = group.get("block_size")
    try:
        if kind == "full":
            return FullAttentionSpec(bs)
        if kind == "sink_full":
            return SinkFullAttentionSpec(bs, sink_len=group.get("sink_len"))
        if kind == "sliding_window":
            return SlidingWindowSpec(bs, sliding_window=group.get("sliding_window"),
                                     num_sink_tokens=group.get("num_sink_tokens") or 0)
        if kind == "chunked_local":
            return ChunkedLocalAttentionSpec(
                bs, attention_chunk_size=group.get("attention_chunk_size"))
        if kind == "mamba":
            return MambaSpec(bs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"cache layout groups[{i}]: {err}") from None
    raise ValueError(f"cache layout groups[{i}] has unknown type {kind!r}; use one of "
                     f"{sorted(_TYPE_NAMES.values())}")
