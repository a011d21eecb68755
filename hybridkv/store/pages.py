"""Copying KV blocks between the paged device memory and host buffers.

The pool's memory is `num_tensors` raw slots of `num_blocks` pages each
(hybridkv.engine.kv_memory); a block id addresses one page in every slot,
and the i-th layer of a group lives in slot i. One block of group g is
therefore its page in slots 0 .. num_layers(g)-1, of which the first
`layer_bytes(g)` bytes are data (an attention page; a Mamba state without
its padding).

`TorchPages.gather` copies blocks out as uint8 `[num_layers, n, layer_bytes]`
(one `index_select` per layer); `scatter` writes blocks given as stored (a
buffer each: the page in each layer, one after another) into other blocks,
on the CPU by one row copy per block and layer straight from those buffers.
`SimulatedPages` does the same bookkeeping without a model (for benchmarks
of hit rates and tests of the tier alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.specs import AttentionSpec, MambaSpec

Buffer = bytes | bytearray | memoryview
BlockIds = Sequence[int] | np.ndarray  # (an int64 array from the eviction recorder)

_WORDS = {8: (torch.int64, np.dtype(np.int64)), 4: (torch.int32, np.dtype(np.int32)),
          2: (torch.int16, np.dtype(np.int16)), 1: (torch.uint8, np.dtype(np.uint8))}


class PageIO(Protocol):
    """What the tier needs from the memory holding the pages."""

    def layout(self, group_id: int) -> tuple[int, int, str]:
        """(num_layers, layer_bytes, dtype name) of one block of the group."""

    def gather(self, group_id: int, block_ids: BlockIds) -> np.ndarray:
        """A copy of these blocks, uint8 `[num_layers, n, layer_bytes]`."""

    def scatter(self, group_id: int, block_ids: Sequence[int], blocks: Sequence[Buffer]) -> None:
        """Write each block's data, as stored (its page in each layer, one after
        another: `num_layers * layer_bytes` bytes), into these blocks."""

    def host_views(self, group_id: int) -> list[np.ndarray] | None:
        """Per layer of the group, a 2-D host array over the pages themselves (a
        row per block id, the data first), or None when the pages are not in
        host memory: a store without I/O may encode blocks straight from them."""


def group_layout(config: KVCacheConfig, group_id: int) -> tuple[int, int, str]:
    """(num_layers, data bytes of one layer's page, dtype) of a group."""
    group = config.kv_cache_groups[group_id]
    spec = group.kv_cache_spec
    if isinstance(spec, MambaSpec):
        return len(group.layer_names), spec.state_bytes, spec.dtype
    if isinstance(spec, AttentionSpec):
        return len(group.layer_names), spec.page_size_bytes, spec.dtype
    raise ValueError(f"no page layout for {type(spec).__name__} (group {group_id})")


class TorchPages:
    """Gather and scatter over the raw slots of a KV cache (CPU or GPU)."""

    def __init__(self, config: KVCacheConfig, slots: Sequence[torch.Tensor]) -> None:
        if len(slots) != config.num_tensors:
            raise ValueError(f"{len(slots)} slots for a layout of {config.num_tensors} tensors")
        self.config = config
        self.device = slots[0].device
        self._layouts = [group_layout(config, g) for g in range(len(config.kv_cache_groups))]
        # per group: the widest integer type dividing its data and the page (copies of
        # 8-byte elements run several times faster than byte by byte), and per layer
        # the data part of every page of that layer's slot, in that type
        self._words: list[tuple[torch.dtype, np.dtype]] = []
        self._pages: list[list[torch.Tensor]] = []
        for g, group in enumerate(config.kv_cache_groups):
            used = self._layouts[g][1]
            size = next(n for n in (8, 4, 2, 1)
                        if used % n == 0 and config.page_size_bytes % n == 0)
            word = _WORDS[size]
            self._words.append(word)
            pages = [s.view(word[0]).view(config.num_blocks, -1) for s in slots]
            self._pages.append([pages[config.layer_to_tensor[name]][:, :used // size]
                                for name in group.layer_names])
        # numpy views of the same memory (CPU): a row copy costs about 1 us there
        self._host_pages = [[p.numpy() for p in group] for group in self._pages] \
            if self.device.type == "cpu" else []

    def layout(self, group_id: int) -> tuple[int, int, str]:
        return self._layouts[group_id]

    def gather(self, group_id: int, block_ids: BlockIds) -> np.ndarray:
        num_layers, used, _ = self._layouts[group_id]
        word = self._words[group_id][0]
        index = torch.as_tensor(np.array(block_ids, dtype=np.int64),
                                device=self.device)
        out = torch.empty((num_layers, len(block_ids), used // word.itemsize), dtype=word)
        for layer, pages in enumerate(self._pages[group_id]):
            if self.device.type == "cpu":
                torch.index_select(pages, 0, index, out=out[layer])
            else:  # pragma: no cover - no GPU in the tests
                out[layer].copy_(pages.index_select(0, index))
        return out.numpy().view(np.uint8)

    def host_views(self, group_id: int) -> list[np.ndarray] | None:
        return self._host_pages[group_id] if self._host_pages else None

    def scatter(self, group_id: int, block_ids: Sequence[int], blocks: Sequence[Buffer]) -> None:
        num_layers, word = len(self._pages[group_id]), self._words[group_id][1]
        if self.device.type == "cpu":  # row copies straight from the stored bytes
            pages = self._host_pages[group_id]
            for block_id, data in zip(block_ids, blocks):
                rows = np.frombuffer(data, dtype=word).reshape(num_layers, -1)
                for layer, layer_pages in enumerate(pages):
                    layer_pages[block_id] = rows[layer]
            return
        # elsewhere: one host buffer, one transfer, one index_copy_ per layer
        src = torch.from_numpy(np.stack([np.frombuffer(d, dtype=word).reshape(num_layers, -1)
                                         for d in blocks])).to(self.device)
        index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        for layer, layer_pages in enumerate(self._pages[group_id]):
            layer_pages.index_copy_(0, index, src[:, layer])


class SimulatedPages:
    """Pages without a model: `layer_bytes` bytes per block and group, one layer.

    Blocks hold whatever was scattered into them, or what `fill` writes (a
    stand-in for a model step); tests read them back to check what a tier
    loaded.
    """

    def __init__(self, num_blocks: int, num_groups: int, layer_bytes: int = 64) -> None:
        self.layer_bytes = layer_bytes
        self.data = np.zeros((num_groups, num_blocks, layer_bytes), dtype=np.uint8)

    def layout(self, group_id: int) -> tuple[int, int, str]:
        return 1, self.layer_bytes, "uint8"

    def gather(self, group_id: int, block_ids: BlockIds) -> np.ndarray:
        return self.data[group_id].take(block_ids, axis=0)[None]

    def host_views(self, group_id: int) -> list[np.ndarray] | None:
        return [self.data[group_id]]

    def scatter(self, group_id: int, block_ids: Sequence[int], blocks: Sequence[Buffer]) -> None:
        for block_id, data in zip(block_ids, blocks):
            self.data[group_id, block_id] = np.frombuffer(data, dtype=np.uint8)

    def fill(self, group_id: int, block_id: int, content: bytes) -> None:
        row = np.frombuffer(content.ljust(self.layer_bytes, b"\0")[:self.layer_bytes],
                            dtype=np.uint8)
        self.data[group_id, block_id] = row
