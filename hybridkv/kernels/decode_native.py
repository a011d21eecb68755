"""Decode attention by the C kernel `_decode_attn`, reading K and V where they lie.

The torch decode path (`attention_decode.py`) first copies every visible key and value
row of a step into new tensors, then scores them. With large heads that copy is most of
the attention's cost: at the Gemma 3 270M shape (head size 256), 8 sequences of about
600 tokens read some 9 MB of K and V per layer, and the copy moves it twice more. The
kernel reads each row once, in place, for all query heads that share its KV head (see
`_decode_attn.c`), so a decode step's attention costs about one pass over its KV bytes.

It is used when the extension was built and the step qualifies: CPU, float32 query and
caches, each cache seen as a flat list of token rows (`paged_rows.row_view`). Otherwise
`can_decode_natively` says no and the torch path runs, with the same results up to
float32 rounding (the sums run in another order).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from hybridkv.kernels.paged_rows import row_views_and_index


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
                            k_rows.shape[1], head_dim, num_keys, k_rows.stride(0), scale)
    return out


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
