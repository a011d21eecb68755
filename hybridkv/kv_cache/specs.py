"""KV cache specs: what one layer needs from the block pool.

A spec says how many tokens a block holds, which earlier tokens a layer still
needs (its attention type), and how many bytes one block of the layer takes
(`page_size_bytes`). Specs are frozen and validated on construction: a bad
value raises ValueError naming the field.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

from hybridkv.kv_cache.checks import check_int

_DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


def dtype_name(dtype: object) -> str:
    """'float16' for 'float16', torch.float16 or 'torch.float16'."""
    name = str(dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


def dtype_size(dtype: object) -> int:
    """Bytes per element of `dtype` (a name or a torch dtype)."""
    name = dtype_name(dtype)
    if name not in _DTYPE_BYTES:
        raise ValueError(f"dtype: unsupported dtype {dtype!r}; use one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


@dataclass(frozen=True)
class KVCacheSpec(ABC):
    """Base of every spec: a block holds `block_size` tokens of one layer."""

    block_size: int

    def __post_init__(self) -> None:
        check_int(f"{type(self).__name__}.block_size", self.block_size, 1)

    @property
    @abstractmethod
    def page_size_bytes(self) -> int:
        """Bytes one block of one layer takes."""

    def with_block_size(self, block_size: int) -> KVCacheSpec:
        """The same spec with another block size (used to unify page sizes)."""
        return replace(self, block_size=block_size)


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    """Attention layers: K and V of `num_kv_heads` x `head_size` per token."""

    num_kv_heads: int = 1
    head_size: int = 64
    dtype: str = "float16"

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_int(f"{owner}.num_kv_heads", self.num_kv_heads, 1)
        check_int(f"{owner}.head_size", self.head_size, 1)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        dtype_size(self.dtype)

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * dtype_size(self.dtype)


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Causal attention over every earlier token."""


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """A token sees itself and the `sliding_window - 1` tokens before it.

    `num_sink_tokens` > 0 keeps the first tokens visible too (StreamingLLM).
    """

    sliding_window: int = 0
    num_sink_tokens: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("SlidingWindowSpec.sliding_window", self.sliding_window, 1)
        check_int("SlidingWindowSpec.num_sink_tokens", self.num_sink_tokens, 0)

    @property
    def num_window_blocks(self) -> int:
        """Blocks before a hit length that must be cached: ceil((W - 1) / B)."""
        return -(-(self.sliding_window - 1) // self.block_size)

    @property
    def num_sink_blocks(self) -> int:
        """Blocks at the start that hold sink tokens: ceil(S / B)."""
        return -(-self.num_sink_tokens // self.block_size)


@dataclass(frozen=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """A token sees only the tokens of its chunk [k*C, (k+1)*C) up to itself."""

    attention_chunk_size: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("ChunkedLocalAttentionSpec.attention_chunk_size", self.attention_chunk_size, 1)
        if self.attention_chunk_size % self.block_size:
            raise ValueError(
                f"ChunkedLocalAttentionSpec.attention_chunk_size ({self.attention_chunk_size}) "
                f"must be a multiple of block_size ({self.block_size})")


@dataclass(frozen=True)
class SinkFullAttentionSpec(AttentionSpec):
    """Full attention plus `sink_len` learned sink KV slots in shared blocks."""

    sink_len: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("SinkFullAttentionSpec.sink_len", self.sink_len, 1)
        if self.sink_len % self.block_size:
            raise ValueError(
                f"SinkFullAttentionSpec.sink_len ({self.sink_len}) must be a positive multiple "
                f"of block_size ({self.block_size})")

    @property
    def num_sink_blocks(self) -> int:
        return self.sink_len // self.block_size


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A recurrent layer: the state after token t replaces all earlier KV.

    `shapes` are the per-block state tensors (e.g. conv state and SSM state);
    `page_size_padded` lets a config pad the page to other groups' page size.
    """

    shapes: tuple[tuple[int, ...], ...] = ((1,),)
    dtype: str = "float32"
    page_size_padded: int | None = field(default=None)
    checkpoint_interval: int = 1

    # checkpoint_interval k: keep the state at every k-th block boundary plus the
    # end of each prompt (k = 1: every boundary).

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.shapes or not all(
                isinstance(s, tuple) and all(isinstance(d, int) and d > 0 for d in s)
                for s in self.shapes):
            raise ValueError(f"MambaSpec.shapes must be non-empty tuples of positive ints, "
                             f"got {self.shapes!r}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        dtype_size(self.dtype)
        check_int("MambaSpec.checkpoint_interval", self.checkpoint_interval, 1)
        if self.page_size_padded is not None and self.page_size_padded < self.state_bytes:
            raise ValueError(f"MambaSpec.page_size_padded ({self.page_size_padded}) is smaller "
                             f"than the state ({self.state_bytes} bytes)")

    @property
    def state_bytes(self) -> int:
        """Bytes of one state (all state tensors of one layer)."""
        return sum(math.prod(s) for s in self.shapes) * dtype_size(self.dtype)

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.state_bytes
