"""Decode attention by the C kernel `_decode_attn`, reading K and V where they lie.

The torch decode path (`attention_decode.py`) first copies every visible key and value
row of a step into new tensors, then scores them. With large heads that copy is most of
the attention's cost: at the Gemma 3 270M shape (head size 256), 8 sequences of about
600 tokens read some 9 MB of K and V per layer, and the copy moves it twice more. The
kernel reads each row once, in place, for all query heads that share its KV head (see
`_decode_attn.c`), so a decode step's attention costs about one pass over its KV bytes.
With more than one torch thread and enough keys, the kernel splits the sequences over
that many threads (at the 270M shape it is a quarter of a decode step, and two threads
halve it); each sequence is computed by one thread, so results do not change.

It is used when the extension was built and the step qualifies: CPU, float32 query and
caches, each cache seen as a flat list of token rows (`paged_rows.row_view`). Otherwise
`can_decode_natively` says no and the torch path runs, with the same results up to
float32 rounding (the sums run in another order).
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import torch

from hybridkv.kernels.paged_rows import row_view, row_views_and_index


def _load() -> Any:
    """The built extension module, or None (then the torch path serves)."""
    try:
        return importlib.import_module("hybridkv._native._decode_attn")
    except ImportError:
        return None


_decode_attn = _load()


def describe() -> str:
    """Which path decode attention takes here (`hybridkv --version`)."""
    if _decode_attn is None:
        return "torch gather + SDPA (the C kernel is not built)"
    return "C kernel (float32 CPU layers; others: torch gather + SDPA)"


def can_decode_natively(query: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor) -> bool:
    """Whether `native_decode_attention` can compute this layer: the kernel is built,
    everything is float32 on CPU and the query heads split evenly over the KV heads."""
    tensors = (query, k_cache, v_cache)
    return (_decode_attn is not None
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and query.shape[1] % k_cache.shape[2] == 0)


def native_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            slots: torch.Tensor, counts: torch.Tensor, num_keys: int,
                            scale: float, memo: dict | None = None) -> torch.Tensor | None:
    """Attention of one query per sequence, `query` `[S, Hq, D]` -> `[S, Hq, D]`, or None
    when the caches cannot be seen as token rows (then the caller takes the torch path).

    `slots` (int64 `[S * num_keys]`) are the cache slots each sequence reads, of which the
    first `counts[s]` (int64 `[S]`, each in 1..num_keys) are visible keys. `memo`: a dict
    living no longer than `slots` and `counts` (the layout's), where the row index and
    the bounds checks are kept for the other layers that read the same slots.
    """
    assert _decode_attn is not None, "the C decode kernel is not built"
    found = row_views_and_index((k_cache, v_cache), slots, memo)
    if found is None:
        return None
    (k_rows, v_rows), index = found  # rows: [num_rows, Hkv, D]; index: [S * num_keys]
    num_seqs, num_q_heads, head_dim = query.shape
    num_rows = min(k_rows.shape[0], v_rows.shape[0])
    key = ("checked", id(index), id(counts), num_seqs, num_keys, num_rows)
    checked = None if memo is None else memo.get(key)
    if checked is None:
        checked = _checked(index, counts, num_seqs, num_keys, num_rows)
        if memo is not None:
            memo[key] = checked
    index, counts = checked
    q = query.contiguous()
    out = torch.empty_like(q)  # [S, Hq, D]
    if num_seqs:
        _decode_attn.decode(q.data_ptr(), out.data_ptr(), k_rows.data_ptr(), v_rows.data_ptr(),
                            index.data_ptr(), counts.data_ptr(), num_seqs, num_q_heads,
                            k_rows.shape[1], head_dim, num_keys, k_rows.stride(0), scale,
                            torch.get_num_threads())
    return out


class TableLayout(NamedTuple):
    """Where each sequence of a decode batch reads its keys, by block table."""

    table: torch.Tensor  # int32 [S, W] contiguous block ids, each below the pool's size
    firsts: torch.Tensor  # int64 [S] position of each sequence's first visible key
    counts: torch.Tensor  # int64 [S] visible keys of each sequence
    max_keys: int


def decode_from_table(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      batch: Any, window: int | None, chunk: int | None,
                      scale: float, softcap: float | None = None,
                      sinks: torch.Tensor | None = None) -> torch.Tensor | None:
    """Attention of one query per sequence of `batch` (an `AttentionBatch` of a decode
    step), `query` `[S, Hq, D]` -> `[S, Hq, D]`, with the kernel finding each key's cache
    row from the block table itself: no slot list is built. The sequence at position
    p sees `[p - window + 1, p]` (`window`), `[p // chunk * chunk, p]` (`chunk`), else
    `[0, p]`. `softcap` c maps each scaled score s to `c * tanh(s / c)`; `sinks` `[Hq]`
    are per-head logits that join each softmax's denominator. None when the kernel cannot
    run here (then the caller takes another path).
    ValueError when a length or block id lies outside the table or the cache."""
    if not can_decode_natively(query, k_cache, v_cache):
        return None
    views = row_view(k_cache), row_view(v_cache)
    if views[0] is None or views[1] is None or views[0][1] != views[1][1]:
        return None
    (k_rows, rows_per_block), (v_rows, _) = views
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    layout = _table_layout(batch, window, chunk, block_size, num_blocks)
    num_seqs, num_q_heads, head_dim = query.shape
    if layout.table.shape[0] != num_seqs:
        raise ValueError(f"a block table of {layout.table.shape[0]} rows for {num_seqs} queries")
    if sinks is not None:
        if sinks.shape != (num_q_heads,):
            raise ValueError(f"sinks of shape {tuple(sinks.shape)} for {num_q_heads} query heads")
        sinks = sinks.to(device="cpu", dtype=torch.float32).contiguous()
    q = query.contiguous()
    out = torch.empty_like(q)  # [S, Hq, D]
    if num_seqs:
        assert _decode_attn is not None
        _decode_attn.decode_table(
            q.data_ptr(), out.data_ptr(), k_rows.data_ptr(), v_rows.data_ptr(),
            layout.table.data_ptr(), layout.firsts.data_ptr(), layout.counts.data_ptr(),
            num_seqs, num_q_heads, k_rows.shape[1], head_dim, layout.max_keys,
            k_rows.stride(0), scale, layout.table.shape[1], block_size, rows_per_block,
            softcap or 0.0, 0 if sinks is None else sinks.data_ptr(), torch.get_num_threads())
    return out


def _table_layout(batch: Any, window: int | None, chunk: int | None, block_size: int,
                  num_blocks: int) -> TableLayout:
    """The batch's `TableLayout`, from `batch.plans` when another layer of the group made
    it; its lengths and block ids checked against the table and the pool."""
    key = ("table", id(batch.block_table), window, chunk, block_size, num_blocks)
    layout = None if batch.plans is None else batch.plans.get(key)
    if layout is None:
        layout = _build_table_layout(batch, window, chunk, block_size, num_blocks)
        if batch.plans is not None:
            batch.plans[key] = layout
    return layout


def _build_table_layout(batch: Any, window: int | None, chunk: int | None, block_size: int,
                        num_blocks: int) -> TableLayout:
    # checked here, not by asserts: the kernel reads raw pointers
    table = batch.block_table.to(torch.int32).contiguous()
    capacity = table.shape[1] * block_size
    seq_lens = batch.seq_lens.tolist()
    if any(not 1 <= n <= capacity for n in seq_lens):
        raise ValueError(f"decode seq_lens must lie in [1, {capacity}] (the block table's "
                         f"capacity), got {seq_lens}")
    if table.numel():
        low, high = torch.aminmax(table)
        if int(low) < 0 or int(high) >= num_blocks:
            raise ValueError(f"a block id of the table lies outside the pool's {num_blocks}")
    firsts = []
    for n in seq_lens:
        first = 0 if window is None else max(0, n - window)
        if chunk is not None:
            first = max(first, (n - 1) // chunk * chunk)
        firsts.append(first)
    counts = [n - first for n, first in zip(seq_lens, firsts)]
    return TableLayout(table, torch.tensor(firsts, dtype=torch.int64),
                       torch.tensor(counts, dtype=torch.int64), max(counts, default=1))


def _checked(index: torch.Tensor, counts: torch.Tensor, num_seqs: int, num_keys: int,
             num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, counts) as the kernel reads them (contiguous int64), once their bounds are
    checked. Checked here, not by asserts: the kernel reads raw pointers (and `python -O`
    drops asserts). ValueError naming what is out of bounds."""
    if index.numel() != num_seqs * num_keys:
        raise ValueError(f"{index.numel()} slots for {num_seqs} sequences of {num_keys} keys")
    if index.numel() and not (0 <= int(index.min()) and int(index.max()) < num_rows):
        raise ValueError(f"a decode slot lies outside the cache's {num_rows} rows")
    counts = counts.to(torch.int64).contiguous()
    if counts.numel() != num_seqs or (num_seqs and not (
            int(counts.min()) >= 1 and int(counts.max()) <= num_keys)):
        raise ValueError(f"key counts must be {num_seqs} values in 1..{num_keys}")
    return index.contiguous(), counts
