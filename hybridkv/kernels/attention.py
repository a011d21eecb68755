"""Paged attention over a block-table KV cache, with a pure-torch path that always works.

Cache layout (the paged layout flash-attn takes): K and V are each
`[num_blocks, block_size, num_kv_heads, head_dim]`. Token `t` of a sequence lives in block
`block_table[s, t // block_size]` at offset `t % block_size`. Block 0 is the null block: it stands
where a sequence no longer needs a block (e.g. outside its sliding window) and is never read.

Visibility rules, identical to Hugging Face transformers' masks, for a query at position `p`
and a key at position `k`:

- causal: `k <= p`;
- sliding window `W`: also `k > p - W`, unless `k < num_sink_tokens` (StreamingLLM sinks);
- chunked local attention `C`: also `k // C == p // C`.

Example (`W = 3`, one sink token, query at position 6): keys 0, 4, 5, 6 are visible.

The torch path cuts the queries into tiles (each decode token is one) and computes groups of
similar tiles at once (`attention_batched`), gathering per tile only the blocks holding keys some
query of the tile can see; other slots are zeroed and masked, so blocks outside a window or chunk
(null or not) never enter the result. Leading blocks that a group's sequences share (a cached
document) are gathered and scored once for the whole group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from hybridkv.kernels.attention_batched import Tile, attend_group, group_tiles, plan_tiles
from hybridkv.kernels.attention_decode import decode_attention, decode_layout, is_decode_batch
from hybridkv.kernels.attention_flash import can_use_flash_attention, flash_paged_attention
from hybridkv.kernels.decode_native import decode_from_table
from hybridkv.kernels.paged_rows import scatter_slots

# Query rows per dense score tile in the torch path: bounds memory at QUERY_TILE x keys per head
# and lets a long windowed prefill read only the keys near each tile.
QUERY_TILE = 256


def query_tile(sliding_window: int | None, block_size: int) -> int:
    """Query rows per tile: QUERY_TILE, or the window (whole blocks) when it is smaller.

    A tile's queries read one run of keys from the window before its first query to its
    last, and score all of them, so a tile of q rows costs q x (q + window) where its
    queries see q x window keys: with a 32-token window, 256-row tiles computed about four
    times the scores that 32-row tiles do.
    """
    if sliding_window is None or sliding_window >= QUERY_TILE:
        return QUERY_TILE
    return max(block_size, -(-sliding_window // block_size) * block_size)


@dataclass
class AttentionBatch:
    """Per-step metadata for one KV cache group (all layers of the group share it).

    `query_start_loc`: int32 `[num_seqs + 1]`, cumulative counts of this step's new tokens.
    `seq_lens`: int32 `[num_seqs]`, context length of each sequence including the new tokens.
    `block_table`: int32 `[num_seqs, max_blocks]`, block ids in token order; 0 = null block.
    `slot_mapping`: int64 `[num_tokens]`, `block_id * block_size + offset` of each new token.
    `max_query_len` / `max_seq_len`: optional host copies of the maxima, so the GPU path needs no
    device-to-host sync; computed from the tensors when left as None.
    `plans`: optional cache of the torch path's query tiling, which depends only on
    `query_start_loc`, `seq_lens` and the mask rules; batches with equal `query_start_loc` and
    `seq_lens` may share one dict (the engine shares one per step among its groups), so layers
    with the same rules plan once. None: plan on every call.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int | None = None
    max_seq_len: int | None = None
    plans: dict | None = None

    @property
    def num_seqs(self) -> int:
        """Number of sequences in the batch."""
        return self.seq_lens.shape[0]


@dataclass(frozen=True)
class MaskRules:
    """Which keys a query sees, and how its scores are shaped before the softmax."""

    scale: float
    sliding_window: int | None = None
    num_sink_tokens: int = 0
    chunk_size: int | None = None
    softcap: float | None = None

    def first_key(self, pos: int) -> int:
        """Smallest non-sink key position a query at `pos` sees (window and chunk start)."""
        first = 0
        if self.sliding_window is not None:
            first = max(first, pos - self.sliding_window + 1)
        if self.chunk_size is not None:
            first = max(first, pos // self.chunk_size * self.chunk_size)
        return first

    def key_positions(self, first_query: int, end: int, device: torch.device) -> torch.Tensor:
        """Positions some query in `[first_query, end)` sees: the sinks, then a contiguous run.

        Example: `W = 3`, 2 sinks, queries 6..7 -> `[0, 1, 4, 5, 6, 7]`.
        """
        first = self.first_key(first_query)
        run = torch.arange(first, end, device=device)
        num_sinks = self.num_visible_sinks(first)
        if num_sinks == 0:
            return run
        return torch.cat([torch.arange(num_sinks, device=device), run])

    def num_visible_sinks(self, first: int) -> int:
        """Sink tokens seen besides a key run starting at `first` (those not already in it)."""
        return min(self.num_sink_tokens, first) if self.sliding_window is not None else 0

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Boolean mask `[n, L]`: query `q_pos[i]` sees key `k_pos[j]`."""
        return self.allows(q_pos[:, None], k_pos[None, :])

    def allows(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Elementwise: a query at position `q` sees a key at `k` (any broadcastable shapes)."""
        mask = k <= q
        if self.sliding_window is not None:
            mask &= (k > q - self.sliding_window) | (k < self.num_sink_tokens)
        if self.chunk_size is not None:
            mask &= (k // self.chunk_size) == (q // self.chunk_size)
        return mask


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    memo: dict | None = None,
) -> None:
    """Write new tokens' K/V into the paged caches, in place.

    `key`/`value`: `[num_tokens, num_kv_heads, head_dim]`; caches:
    `[num_blocks, block_size, num_kv_heads, head_dim]`; `slot_mapping`: `[num_tokens]` with
    `slot = block_id * block_size + offset` (every slot must be a valid index). `memo`: a
    dict living no longer than `slot_mapping` (the batch's `plans`), where the row index
    derived from the slots is kept for the group's other layers.
    Raises ValueError on mismatched shapes.
    """
    if key.shape != value.shape or key.dim() != 3:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must be the "
                         "same [num_tokens, num_kv_heads, head_dim] shape")
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must "
                         "be the same [num_blocks, block_size, num_kv_heads, head_dim] shape")
    if key.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"key heads/head_dim {tuple(key.shape[1:])} do not match the cache's "
                         f"{tuple(k_cache.shape[2:])}")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping shape {tuple(slot_mapping.shape)} must be "
                         f"({key.shape[0]},), one slot per token")
    scatter_slots(slot_mapping, (k_cache, key), (v_cache, value), memo=memo)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    *,
    scale: float,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    chunk_size: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of this step's new tokens over their cached context.

    `query`: `[num_tokens, num_q_heads, head_dim]`; sequence `s` owns rows
    `query_start_loc[s]:query_start_loc[s+1]`, its last `n_s` positions
    `seq_lens[s] - n_s .. seq_lens[s] - 1`. Their K/V must already be in the cache (`write_kv`).
    `num_q_heads` must be a multiple of `num_kv_heads` (GQA: q head `h` reads kv head
    `h // (num_q_heads // num_kv_heads)`). `softcap` c maps scores to `c * tanh(score / c)`;
    `sinks` `[num_q_heads]` are learned logits joining the softmax denominator as a key with a
    zero value (gpt-oss). Returns `[num_tokens, num_q_heads, head_dim]` in `query.dtype`.
    Uses flash-attn on CUDA when it supports the options, else the torch path.
    Raises ValueError on mismatched shapes or invalid options.
    """
    _check_tensors(query, k_cache, v_cache, sinks)
    _check_options(sliding_window, num_sink_tokens, chunk_size, softcap)
    _check_batch_shapes(query, batch)
    if can_use_flash_attention(query, k_cache, num_sink_tokens=num_sink_tokens,
                               chunk_size=chunk_size, sinks=sinks):
        return flash_paged_attention(query, k_cache, v_cache, batch, scale=scale,
                                     sliding_window=sliding_window, softcap=softcap)
    rules = MaskRules(scale, sliding_window, num_sink_tokens, chunk_size, softcap)
    return torch_paged_attention(query, k_cache, v_cache, batch, rules, sinks)


def torch_paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    rules: MaskRules,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-torch path of `paged_attention` (any device): one fused call for a decode
    batch (`attention_decode`), else groups of similar query tiles."""
    block_size = k_cache.shape[1]
    if is_decode_batch(query, batch, rules, sinks, native=True):
        out = decode_from_table(query, k_cache, v_cache, batch, rules.sliding_window,
                                rules.chunk_size, rules.scale, rules.softcap, sinks)
        if out is not None:
            return out
        if rules.softcap is None and sinks is None:  # else the grouped path below
            layout = decode_layout(batch, rules, block_size)
            return decode_attention(query, k_cache, v_cache, layout, rules.scale)
    plan = _plan(batch, rules, block_size, query)
    if plan.max_seq_len > batch.block_table.shape[1] * block_size:
        raise ValueError(f"seq_len {plan.max_seq_len} exceeds the block table's capacity of "
                         f"{batch.block_table.shape[1] * block_size} tokens")
    out = torch.empty_like(query)  # [num_tokens, Hq, D]
    for group, memo in plan.groups:
        attend_group(query, k_cache, v_cache, batch.block_table, group, rules, sinks, out, memo)
    return out


class _Plan(NamedTuple):
    """How the torch path cuts a batch's queries: groups of tiles, each with the memo of
    what `attend_group` derives from it alone."""

    groups: list[tuple[list[Tile], dict]]
    max_seq_len: int


def _plan(batch: AttentionBatch, rules: MaskRules, block_size: int,
          query: torch.Tensor) -> _Plan:
    """The batch's tiling under `rules`, from `batch.plans` when another layer made it."""
    key = (rules, block_size, query.shape[0], query.shape[1], query.device)
    plan = None if batch.plans is None else batch.plans.get(key)
    if plan is not None:
        return plan
    starts = batch.query_start_loc.tolist()
    seq_lens = batch.seq_lens.tolist()
    _check_lengths(starts, seq_lens, query.shape[0], batch.block_table.shape[1] * block_size)
    tiles = plan_tiles(starts, seq_lens, rules, query_tile(rules.sliding_window, block_size),
                       block_size)
    plan = _Plan([(group, {}) for group in group_tiles(tiles, query.shape[1])],
                 max(seq_lens, default=0))
    if batch.plans is not None:
        batch.plans[key] = plan
    return plan


def _check_tensors(query, k_cache, v_cache, sinks) -> None:
    if query.dim() != 3:
        raise ValueError(f"query must be [num_tokens, num_q_heads, head_dim], "
                         f"got shape {tuple(query.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must "
                         "be the same [num_blocks, block_size, num_kv_heads, head_dim] shape")
    num_q_heads, head_dim = query.shape[1:]
    if head_dim != k_cache.shape[3]:
        raise ValueError(f"query head_dim {head_dim} != cache head_dim {k_cache.shape[3]}")
    if num_q_heads % k_cache.shape[2] != 0:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of "
                         f"num_kv_heads {k_cache.shape[2]}")
    if sinks is not None and sinks.shape != (num_q_heads,):
        raise ValueError(f"sinks shape {tuple(sinks.shape)} must be ({num_q_heads},)")


def _check_options(sliding_window, num_sink_tokens, chunk_size, softcap) -> None:
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    if num_sink_tokens < 0:
        raise ValueError(f"num_sink_tokens must be >= 0, got {num_sink_tokens}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if chunk_size is not None and num_sink_tokens > 0:
        raise ValueError("num_sink_tokens applies to sliding_window, not to chunk_size")
    if softcap is not None and softcap <= 0:
        raise ValueError(f"softcap must be > 0, got {softcap}")


def _check_batch_shapes(query: torch.Tensor, batch: AttentionBatch) -> None:
    num_seqs = batch.num_seqs
    if batch.seq_lens.dim() != 1 or batch.query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(f"query_start_loc shape {tuple(batch.query_start_loc.shape)} must be "
                         f"({num_seqs + 1},) for {num_seqs} sequences")
    if batch.block_table.dim() != 2 or batch.block_table.shape[0] != num_seqs:
        raise ValueError(f"block_table shape {tuple(batch.block_table.shape)} must be "
                         f"({num_seqs}, max_blocks)")


def _check_lengths(starts: list[int], seq_lens: list[int], num_tokens: int, capacity: int) -> None:
    if starts[0] != 0 or starts[-1] != num_tokens:
        raise ValueError(f"query_start_loc must run from 0 to num_tokens={num_tokens}, "
                         f"got {starts[0]}..{starts[-1]}")
    for s, seq_len in enumerate(seq_lens):
        num_new = starts[s + 1] - starts[s]
        if num_new < 0 or num_new > seq_len:
            raise ValueError(f"sequence {s}: {num_new} new tokens but seq_len {seq_len}")
        if seq_len > capacity:
            raise ValueError(f"sequence {s}: seq_len {seq_len} exceeds the block table's "
                             f"capacity of {capacity} tokens")
