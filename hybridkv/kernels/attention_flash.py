"""flash-attn dispatch for paged attention on CUDA.

flash-attn 2's paged varlen kernel takes the cache layout used here as is
(`[num_blocks, block_size, num_kv_heads, head_dim]` plus a block table), so this is a dispatch,
not a conversion. It covers causal attention with an optional sliding window and softcap, in
fp16/bf16, with pages whose size is a multiple of 256 tokens. Sink logits, chunked local attention
and StreamingLLM sink tokens are not expressible there and stay on the torch path.

`flash_attn` is imported only inside these functions, and only for CUDA tensors.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hybridkv.kernels.attention import AttentionBatch

# flash-attn 2 requires the paged KV block size to be divisible by this.
FLASH_PAGE_MULTIPLE = 256
FLASH_MAX_HEAD_DIM = 256
_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def can_use_flash_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    *,
    num_sink_tokens: int,
    chunk_size: int | None,
    sinks: torch.Tensor | None,
) -> bool:
    """True when `flash_paged_attention` computes exactly what the torch path would."""
    if not (query.is_cuda and k_cache.is_cuda):
        return False
    if query.dtype not in _FLASH_DTYPES or k_cache.dtype != query.dtype:
        return False
    if k_cache.shape[1] % FLASH_PAGE_MULTIPLE != 0 or query.shape[-1] > FLASH_MAX_HEAD_DIM:
        return False
    if sinks is not None or chunk_size is not None or num_sink_tokens > 0:
        return False
    return _flash_attn_importable()


@functools.cache
def _flash_attn_importable() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def flash_paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    *,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """Paged attention through `flash_attn_varlen_func` with a block table.

    A window `W` (the key itself and `W - 1` before it) is flash-attn's
    `window_size=(W - 1, 0)`; its causal mask is aligned to the end of each sequence, which is
    where this step's queries sit. Returns `[num_tokens, num_q_heads, head_dim]`.
    """
    from flash_attn import flash_attn_varlen_func

    seq_lens = batch.seq_lens  # int32 [num_seqs]
    cu_seqlens_k = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
    cu_seqlens_k[1:] = torch.cumsum(seq_lens, dim=0)
    max_query_len = batch.max_query_len
    if max_query_len is None:
        max_query_len = int(batch.query_start_loc.diff().max().item()) if seq_lens.numel() else 0
    max_seq_len = batch.max_seq_len
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if seq_lens.numel() else 0
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
    return flash_attn_varlen_func(
        query,
        k_cache,
        v_cache,
        cu_seqlens_q=batch.query_start_loc,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_query_len,
        max_seqlen_k=max_seq_len,
        softmax_scale=scale,
        causal=True,
        window_size=window,
        softcap=0.0 if softcap is None else softcap,
        block_table=batch.block_table,
    )
