"""Device memory for the KV cache: one shared buffer per tensor slot.

Tensor slot i is shared by the i-th layer of every group (KVCacheConfig), so
a block id addresses one page in each slot whatever group holds it. Each
layer sees its slot through a typed view:

- attention: K and V as `[num_blocks, block_size, num_kv_heads, head_dim]`
  (the paged layout flash-attn takes; K and V of a block are adjacent, so
  the block stride is twice the page half);
- Mamba: one view per state tensor, `[num_blocks, *shape]`.
"""

from __future__ import annotations

import math

import torch

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.specs import AttentionSpec, KVCacheSpec, MambaSpec


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype")
    return dtype


def allocate_kv_memory(config: KVCacheConfig, device: str | torch.device = "cpu",
                       fill: float | None = None) -> dict[str, tuple[torch.Tensor, ...]]:
    """Allocate every tensor slot once; return each layer's views.

    `fill` initializes the memory (e.g. NaN to expose reads of unwritten
    blocks); the default leaves it uninitialized (zeros for Mamba state
    views is the runner's job on first use).
    """
    return kv_views(config, allocate_kv_slots(config, device), fill)


def allocate_kv_slots(config: KVCacheConfig,
                      device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """The raw tensor slots, uint8 `[num_blocks * page_size_bytes]` each."""
    if not config.page_size_bytes or not config.num_tensors:
        raise ValueError("KVCacheConfig has no memory layout; build it with "
                         "KVCacheConfig.from_layer_specs")
    return [torch.empty(config.num_blocks * config.page_size_bytes, dtype=torch.uint8,
                        device=device) for _ in range(config.num_tensors)]


def kv_views(config: KVCacheConfig, slots: list[torch.Tensor],
             fill: float | None = None) -> dict[str, tuple[torch.Tensor, ...]]:
    """Each layer's typed views of its slot (see `allocate_kv_memory`)."""
    views: dict[str, tuple[torch.Tensor, ...]] = {}
    for group in config.kv_cache_groups:
        for name in group.layer_names:
            raw = slots[config.layer_to_tensor[name]]
            views[name] = layer_views(raw, group.kv_cache_spec, config.num_blocks,
                                      config.page_size_bytes)
    if fill is not None:
        for tensors in views.values():
            for t in tensors:
                t.fill_(fill)
    return views


def layer_views(raw: torch.Tensor, spec: KVCacheSpec, num_blocks: int,
                page_size: int) -> tuple[torch.Tensor, ...]:
    """Typed views of one layer's pages inside a slot's raw bytes."""
    pages = raw.view(num_blocks, page_size)
    if isinstance(spec, AttentionSpec):
        dtype = torch_dtype(spec.dtype)
        elems = spec.page_size_bytes // dtype.itemsize
        kv = pages[:, :spec.page_size_bytes].view(dtype).view(num_blocks, elems)
        kv = kv.view(num_blocks, 2, spec.block_size, spec.num_kv_heads, spec.head_size)
        return kv[:, 0], kv[:, 1]
    if isinstance(spec, MambaSpec):
        dtype = torch_dtype(spec.dtype)
        out, offset = [], 0
        for shape in spec.shapes:
            nbytes = math.prod(shape) * dtype.itemsize
            part = pages[:, offset:offset + nbytes].view(dtype).view(num_blocks, *shape)
            out.append(part)
            offset += nbytes
        return tuple(out)
    raise ValueError(f"no memory layout for {type(spec).__name__}")
