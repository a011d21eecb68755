"""Token rows of a paged cache, read and written with one index per token.

A layer's K (or V) cache is `[num_blocks, block_size, num_kv_heads, head_dim]`, but
its blocks need not be adjacent: the engine keeps K and V of a block in one page, so
the block stride is twice `block_size` rows, and pages may carry other groups' bytes.
Indexing such a view with two index tensors (`cache[blocks, offsets]`) goes through
torch's generic advanced-indexing kernel, which on CPU costs milliseconds per decode
layer at head size 256. When the block stride is a whole number of token rows, the
same memory can instead be seen as a flat list of rows, `[num_rows, num_kv_heads,
head_dim]`, where slot `block * block_size + offset` is row `block * rows_per_block +
offset`; `index_select` / `index_copy_` on that view are plain row copies.

Example: block size 2, K and V adjacent in each page (rows_per_block 4): slots
`[0, 1, 2, 5]` are rows `[0, 1, 4, 9]`.
"""

from __future__ import annotations

import torch


def row_view(cache: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """(rows `[num_rows, Hkv, D]`, rows_per_block) over `cache`'s memory, or None.

    None when a token row is not contiguous or the block stride is not a whole number
    of rows (then only `cache[blocks, offsets]` addresses it).
    """
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    row = num_kv_heads * head_dim
    if cache.stride()[1:] != (row, head_dim, 1) or cache.stride(0) % row:
        return None
    rows_per_block = cache.stride(0) // row
    num_rows = (num_blocks - 1) * rows_per_block + block_size if num_blocks else 0
    rows = torch.as_strided(cache, (num_rows, num_kv_heads, head_dim), (row, head_dim, 1),
                            cache.storage_offset())
    return rows, rows_per_block


def slots_to_rows(slots: torch.Tensor, block_size: int, rows_per_block: int) -> torch.Tensor:
    """Row index of each slot (int64, same shape as `slots`)."""
    slots = slots.long()
    if rows_per_block == block_size:
        return slots
    return slots // block_size * rows_per_block + slots % block_size


def gather_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The token rows `slots` of `cache`: `[len(slots), Hkv, D]`, a new tensor."""
    view = row_view(cache)
    block_size = cache.shape[1]
    if view is None:
        slots = slots.long()
        return cache[slots // block_size, slots % block_size]
    rows, rows_per_block = view
    return rows.index_select(0, slots_to_rows(slots, block_size, rows_per_block))


def scatter_slots(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Write `values` `[len(slots), Hkv, D]` into the token rows `slots` of `cache`."""
    values = values.to(cache.dtype)
    view = row_view(cache)
    block_size = cache.shape[1]
    if view is None:
        slots = slots.long()
        cache[slots // block_size, slots % block_size] = values
        return
    rows, rows_per_block = view
    rows.index_copy_(0, slots_to_rows(slots, block_size, rows_per_block), values)
