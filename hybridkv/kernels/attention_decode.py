"""Decode batches in the torch path: one gather and one fused softmax call per layer.

When every sequence of a step brings exactly one new token (a decode batch) and the
layer has no softcap, sink logits or sink tokens, the query of sequence `s` (at position
`p = seq_lens[s] - 1`) sees one contiguous run of keys: `[p - W + 1, p]` under a sliding
window `W`, `[p // C * C, p]` under chunked attention `C`, `[0, p]` otherwise. So each
sequence's visible keys are gathered by cache slot, padded to the longest run, and all
sequences are scored by a single `scaled_dot_product_attention` call with a boolean mask.

Where the C kernel is built and the layer is float32 on CPU, the same slots are read in
place instead of gathered (`decode_native.py`); the gather and SDPA remain the fallback.

Padding slots point at the sequence's newest slot (written this step, so never stale or
NaN) and are masked out. The slots and the mask depend only on the group's block table,
the lengths and the mask rules, so they are built once per step and group and shared by
the group's layers.

Example: `W = 4`, block size 2, `seq_lens = [3, 6]`, block table `[[5, 7, 0], [2, 9, 4]]`:
sequence 0 sees positions 0..2 (slots 10, 11, 14; padded with 14), sequence 1 positions
2..5 (slots 18, 19, 8, 9); mask `[[1, 1, 1, 0], [1, 1, 1, 1]]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from hybridkv.kernels.decode_native import can_decode_natively, native_decode_attention
from hybridkv.kernels.paged_rows import gather_slots

if TYPE_CHECKING:
    from hybridkv.kernels.attention import AttentionBatch, MaskRules

SDPA_HAS_GQA = torch.__version__ >= "2.5"


class DecodeLayout(NamedTuple):
    """Which cache slots each sequence of a decode batch reads."""

    slots: torch.Tensor  # int64 [S * L] flat slot of each (sequence, key), padded
    mask: torch.Tensor | None  # bool [S, 1, 1, L] slot holds a visible key; None: all do
    num_keys: int  # L, the longest run
    counts: torch.Tensor  # int64 [S] visible keys of each sequence (its first slots)
    memo: dict  # what the group's layers derive from the slots alike (row index, checks)


def is_decode_batch(query: torch.Tensor, batch: AttentionBatch, rules: MaskRules,
                    sinks: torch.Tensor | None, native: bool = False) -> bool:
    """Whether `decode_attention` computes this layer: one query per sequence, no softcap
    or sink logits (unless `native`: the C kernel applies both), no sink tokens, and
    torch's SDPA can group query heads itself."""
    if (not SDPA_HAS_GQA or (not native and (sinks is not None or rules.softcap is not None))
            or rules.num_sink_tokens or query.shape[0] != batch.num_seqs):
        return False
    max_query_len = batch.max_query_len
    if max_query_len is None:
        max_query_len = int((batch.query_start_loc[1:] - batch.query_start_loc[:-1]).max())
    return max_query_len == 1


def decode_layout(batch: AttentionBatch, rules: MaskRules, block_size: int) -> DecodeLayout:
    """Slots and mask of the batch's visible keys, from `batch.plans` when another layer of
    the group made them. ValueError when a length is below 1 or past the table's capacity."""
    key = ("decode", id(batch.block_table), rules.sliding_window, rules.chunk_size, block_size)
    layout = None if batch.plans is None else batch.plans.get(key)
    if layout is None:
        layout = _build_layout(batch, rules, block_size)
        if batch.plans is not None:
            batch.plans[key] = layout
    return layout


def _build_layout(batch: AttentionBatch, rules: MaskRules, block_size: int) -> DecodeLayout:
    seq_lens = batch.seq_lens.long()  # [S]
    table = batch.block_table
    capacity = table.shape[1] * block_size
    if seq_lens.numel() and (int(seq_lens.min()) < 1 or int(seq_lens.max()) > capacity):
        raise ValueError(f"decode seq_lens must lie in [1, {capacity}] (the block table's "
                         f"capacity), got {batch.seq_lens.tolist()}")
    last = seq_lens - 1  # [S] position of each query
    first = torch.zeros_like(last)
    if rules.sliding_window is not None:
        first = torch.clamp(last - rules.sliding_window + 1, min=0)
    if rules.chunk_size is not None:
        first = torch.maximum(first, last // rules.chunk_size * rules.chunk_size)
    counts = last - first + 1  # [S]
    num_keys = int(counts.max()) if counts.numel() else 1
    step = torch.arange(num_keys, device=table.device)  # [L]
    valid = step < counts[:, None]  # [S, L]
    pos = torch.where(valid, first[:, None] + step, last[:, None])  # [S, L]
    blocks = table.long().gather(1, pos // block_size)  # [S, L]
    slots = (blocks * block_size + pos % block_size).flatten()
    mask = None if bool(valid.all()) else valid[:, None, None, :]
    return DecodeLayout(slots, mask, num_keys, counts, {})


def decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     layout: DecodeLayout, scale: float) -> torch.Tensor:
    """Attention of one query per sequence: `query` `[S, Hq, D]` -> `[S, Hq, D]`, by the C
    kernel when it can (`decode_native.py`), else by a gather and torch's SDPA."""
    if can_decode_natively(query, k_cache, v_cache):
        out = native_decode_attention(query, k_cache, v_cache, layout.slots, layout.counts,
                                      layout.num_keys, scale, layout.memo)
        if out is not None:
            return out
    num_seqs, num_kv_heads, head_dim = query.shape[0], k_cache.shape[2], k_cache.shape[3]
    shape = (num_seqs, layout.num_keys, num_kv_heads, head_dim)
    # k, v: [S, Hkv, L, D], float32 like the rest of the torch path
    k, v = (rows.view(shape).transpose(1, 2).float()
            for rows in gather_slots(layout.slots, k_cache, v_cache))
    q = query.float().unsqueeze(2)  # [S, Hq, 1, D]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.mask, scale=scale,
                                         enable_gqa=num_kv_heads != query.shape[1])
    return out.squeeze(2).to(query.dtype)  # [S, Hq, D]

