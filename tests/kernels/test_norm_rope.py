"""The C norm / residual / rotary kernel against torch: Hugging Face's rotary function and
RMSNorm modules, and the module's torch reference path."""

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm, apply_rotary_pos_emb

from hybridkv.kernels import norm_rope
from hybridkv.kernels.norm_rope import (
    norm_rope_qk,
    residual_norm,
    residual_norm_reference,
    rms_norm,
)

pytestmark = pytest.mark.skipif(norm_rope._norm_rope is None,
                                reason="the C norm and rotary kernel is not built")
CLOSE = {"rtol": 1e-6, "atol": 1e-6}


def weight(dim, seed, eps=1e-6):
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed)) + 1.0, eps


def angles(tokens, half, seed):
    positions = torch.randint(0, 4000, (tokens,), generator=torch.Generator().manual_seed(seed))
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
    a = positions.float()[:, None] * inv_freq[None, :]
    return a.cos(), a.sin()


@pytest.mark.parametrize("shape", [(1, 64), (8, 640), (3, 4, 256), (8, 40)])
def test_rms_norm_matches_hugging_face(shape):
    module = Gemma3RMSNorm(shape[-1], eps=1e-6)
    with torch.no_grad():
        module.weight.normal_(generator=torch.Generator().manual_seed(1))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 3
    got = rms_norm(x, (module.weight.detach() + 1.0, 1e-6))
    torch.testing.assert_close(got, module(x), **CLOSE)


def test_rms_norm_of_a_column_slice():
    product = torch.randn(8, 96)
    x = product[:, 32:]  # rows 96 floats apart
    w = weight(64, 3)
    torch.testing.assert_close(rms_norm(x, w), rms_norm(x.contiguous(), w), **CLOSE)


@pytest.mark.parametrize("post,pre", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("in_place", [False, True])
def test_residual_norm_matches_the_reference(post, pre, in_place):
    g = torch.Generator().manual_seed(4)
    hidden, x = torch.randn(8, 640, generator=g), torch.randn(8, 640, generator=g) * 5
    post_w = weight(640, 5) if post else None
    pre_w = weight(640, 6) if pre else None
    want_h, want_y = residual_norm_reference(hidden, x, post_w, pre_w)
    original = hidden.clone()
    got_h, got_y = residual_norm(hidden, x, post_w, pre_w, in_place=in_place)
    torch.testing.assert_close(got_h, want_h, **CLOSE)
    assert (got_y is None) == (want_y is None)
    if want_y is not None:
        torch.testing.assert_close(got_y, want_y, **CLOSE)
    assert (got_h is hidden) == in_place
    if not in_place:
        assert torch.equal(hidden, original)  # the caller's tensor is left alone


def test_residual_norm_in_float64_takes_the_reference():
    hidden, x = torch.randn(4, 64, dtype=torch.float64), torch.randn(4, 64, dtype=torch.float64)
    w = (weight(64, 7)[0].double(), 1e-6)
    got_h, _ = residual_norm(hidden, x, None, w)
    assert torch.equal(got_h, hidden + x)


@pytest.mark.parametrize("dim", [32, 256, 40])
def test_rotary_equals_hugging_face_bit_for_bit(dim):
    tokens, q_heads, k_heads = 8, 4, 2
    g = torch.Generator().manual_seed(dim)
    # q, k, v as column slices of one product, as the stacked projection leaves them
    product = torch.randn(tokens, (q_heads + 2 * k_heads) * dim, generator=g)
    q = product[:, :q_heads * dim].view(tokens, q_heads, dim)
    k = product[:, q_heads * dim:(q_heads + k_heads) * dim].view(tokens, k_heads, dim)
    cos, sin = angles(tokens, dim // 2, dim)
    full_cos, full_sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                          full_cos, full_sin)
    v_before = product[:, (q_heads + k_heads) * dim:].clone()
    assert norm_rope_qk(q, k, cos, sin) is not None
    assert torch.equal(q, want_q[0].transpose(0, 1))
    assert torch.equal(k, want_k[0].transpose(0, 1))
    assert torch.equal(product[:, (q_heads + k_heads) * dim:], v_before)  # v untouched


def test_head_norms_then_rotary_match_the_modules():
    tokens, heads, dim = 8, 4, 256
    q_norm, k_norm = Gemma3RMSNorm(dim, eps=1e-6), Gemma3RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        q_norm.weight.normal_(generator=torch.Generator().manual_seed(8))
        k_norm.weight.normal_(generator=torch.Generator().manual_seed(9))
    q, k = torch.randn(tokens, heads, dim) * 2, torch.randn(tokens, 1, dim)
    cos, sin = angles(tokens, dim // 2, 10)
    full_cos, full_sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]
    want_q, want_k = apply_rotary_pos_emb(q_norm(q).transpose(0, 1)[None],
                                          k_norm(k).transpose(0, 1)[None], full_cos, full_sin)
    got = norm_rope_qk(q, k, cos, sin, (q_norm.weight.detach() + 1, 1e-6),
                       (k_norm.weight.detach() + 1, 1e-6))
    assert got is not None
    torch.testing.assert_close(got[0], want_q[0].transpose(0, 1), **CLOSE)
    torch.testing.assert_close(got[1], want_k[0].transpose(0, 1), **CLOSE)


def test_what_the_rotary_kernel_refuses():
    q, k = torch.randn(8, 4, 32), torch.randn(8, 2, 32)
    cos, sin = angles(8, 16, 11)
    before = q.clone()
    assert norm_rope_qk(q.double(), k.double(), cos, sin) is None
    assert norm_rope_qk(q, k, cos[:4], sin[:4]) is None  # one angle row per token
    assert norm_rope_qk(q.transpose(1, 2), k, cos, sin) is None  # heads not contiguous
    assert norm_rope_qk(q, k, cos, sin, weight(32, 1, 1e-6), weight(32, 2, 1e-5)) is None
    assert torch.equal(q, before)
