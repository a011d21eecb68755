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


def row_views_and_index(caches: tuple[torch.Tensor, ...], slots: torch.Tensor,
                        memo: dict | None = None
                        ) -> tuple[list[torch.Tensor], torch.Tensor] | None:
    """(each cache's row view, the row index of `slots`) when every cache is seen as
    rows alike (K and V of one layer: the same index serves both), else None.

    `memo`: a dict that lives no longer than `slots` (e.g. a step's plans), where the
    index is kept for the other layers reading the same slots the same way."""
    views: list[tuple[torch.Tensor, int]] = []
    for cache in caches:
        view = row_view(cache)
        if view is None or (views and view[1] != views[0][1]):
            return None
        views.append(view)
    block_size, rows_per_block = caches[0].shape[1], views[0][1]
    key = ("rows", id(slots), block_size, rows_per_block)
    index = None if memo is None else memo.get(key)
    if index is None:
        index = slots_to_rows(slots, block_size, rows_per_block)
        if memo is not None:
            memo[key] = index
    return [rows for rows, _ in views], index


def gather_slots(slots: torch.Tensor, *caches: torch.Tensor) -> list[torch.Tensor]:
    """The token rows `slots` of each cache: `[len(slots), Hkv, D]` each, new tensors
    (K and V of a layer in one call share the row index)."""
    found = row_views_and_index(caches, slots)
    if found is None:
        slots = slots.long()
        return [cache[slots // cache.shape[1], slots % cache.shape[1]] for cache in caches]
    views, index = found
    return [rows.index_select(0, index) for rows in views]


def scatter_slots(slots: torch.Tensor, *pairs: tuple[torch.Tensor, torch.Tensor],
                  memo: dict | None = None) -> None:
    """Write each `(cache, values)`'s values `[len(slots), Hkv, D]` into the token rows
    `slots` of its cache (K and V of a layer in one call share the row index; `memo` as
    for `row_views_and_index`)."""
    found = row_views_and_index(tuple(cache for cache, _ in pairs), slots, memo)
    if found is None:
        slots = slots.long()
        for cache, values in pairs:
            block_size = cache.shape[1]
            cache[slots // block_size, slots % block_size] = values.to(cache.dtype)
        return
    views, index = found
    for rows, (cache, values) in zip(views, pairs):
        rows.index_copy_(0, index, values.to(cache.dtype))
