"""Paged attention (torch path) against Hugging Face's own masks and eager attention."""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    chunked_overlay,
    sliding_window_overlay,
)
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

from tests.kernels.test_attention import HEAD_DIM, Case, is_visible, make_case, run


def hf_mask(seq_len, window=None, chunk=None) -> torch.Tensor:
    """Boolean [seq_len, seq_len] mask from transformers' mask functions."""
    mask_fn = causal_mask_function
    if window is not None:
        mask_fn = and_masks(sliding_window_overlay(window), causal_mask_function)
    if chunk is not None:
        mask_fn = and_masks(chunked_overlay(chunk, torch.zeros(1, dtype=torch.long)),
                            causal_mask_function)
    idx = torch.arange(seq_len)
    return mask_fn(0, 0, idx[:, None], idx[None, :])


@pytest.mark.parametrize("window,chunk", [(None, None), (1, None), (5, None), (None, 6)])
def test_rule_matches_transformers_masks(window, chunk):
    mask = hf_mask(23, window, chunk)
    ours = torch.tensor([[is_visible(p, k, window, 0, chunk) for k in range(23)]
                         for p in range(23)])
    assert torch.equal(mask, ours)


class _EagerModule(torch.nn.Module):
    def __init__(self, num_q_heads, num_kv_heads, sinks=None):
        super().__init__()
        self.num_key_value_groups = num_q_heads // num_kv_heads
        self.head_dim = HEAD_DIM
        if sinks is not None:
            self.sinks = torch.nn.Parameter(sinks)
        self.eval()


def hf_eager(eager, case: Case, mask: torch.Tensor, **kwargs) -> torch.Tensor:
    """Transformers' eager attention on one whole-sequence prefill, as [seq_len, Hq, D]."""
    query = case.query.transpose(0, 1)[None]  # [1, Hq, n, D]
    key = case.keys[0].transpose(0, 1)[None]  # [1, Hkv, n, D]
    value = case.values[0].transpose(0, 1)[None]
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    module = _EagerModule(query.shape[1], key.shape[1], kwargs.pop("sinks", None))
    with torch.no_grad():
        out, _ = eager(module, query, key, value, additive[None, None], **kwargs)
    return out[0]


def test_matches_gemma2_eager_softcap_window():
    case = make_case([(29, 29)], block_size=4, num_q_heads=4, num_kv_heads=2)
    case.query.mul_(4.0)
    expected = hf_eager(gemma2_eager, case, hf_mask(29, window=7), scaling=0.4, softcap=3.0)
    out = run(case, scale=0.4, sliding_window=7, softcap=3.0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_matches_gpt_oss_eager_sinks_window():
    case = make_case([(29, 29)], block_size=4, num_q_heads=4, num_kv_heads=2)
    sinks = torch.tensor([0.3, -0.7, 1.5, 0.0])
    expected = hf_eager(gpt_oss_eager, case, hf_mask(29, window=6), scaling=0.5, sinks=sinks)
    out = run(case, scale=0.5, sliding_window=6, sinks=sinks)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
