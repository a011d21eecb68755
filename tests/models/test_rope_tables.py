"""Our rotary tables and rotations against Hugging Face's rope functions."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama4 import modeling_llama4
from transformers.models.qwen2 import modeling_qwen2

from hybridkv.models.rope import rotary_from_params

HEAD_DIM = 32

PARAMS = {
    "default": {"rope_type": "default", "rope_theta": 10_000.0},
    "linear": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "rope_theta": 150_000.0, "factor": 32.0, "beta_fast": 32.0,
             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    "yarn-truncated": {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0,
                       "original_max_position_embeddings": 256},
    "yarn-mscale": {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 40.0, "mscale": 1.0,
                    "mscale_all_dim": 0.707, "original_max_position_embeddings": 128},
}


def _hf_table(params):
    config = LlamaConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4, head_dim=HEAD_DIM,
                         max_position_embeddings=8192, rope_parameters=dict(params))
    rope_type = params["rope_type"]
    if rope_type == "default":
        return modeling_qwen2.Qwen2RotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")


@pytest.mark.parametrize("name", list(PARAMS))
def test_inv_freq_and_scaling_match_hf(name):
    inv_freq, scaling = _hf_table(PARAMS[name])
    ours = rotary_from_params(PARAMS[name], HEAD_DIM, max_position_embeddings=8192)
    torch.testing.assert_close(ours.inv_freq, inv_freq.float(), rtol=1e-6, atol=0)
    assert ours.attention_scaling == pytest.approx(scaling, rel=1e-6)


def _angles(rotary, positions):
    cos, sin = rotary.cos_sin(positions)
    assert cos.shape == (positions.numel(), HEAD_DIM // 2)
    return cos, sin


def test_halves_rotation_matches_hf_rotate_half():
    rotary = rotary_from_params(PARAMS["yarn"], HEAD_DIM)
    positions = torch.tensor([0, 1, 7, 300, 5000])
    x = torch.randn(5, 3, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    cos, sin = _angles(rotary, positions)
    ours = rotary.apply(x, cos, sin)
    full_cos, full_sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # [T, D]
    expected, _ = modeling_qwen2.apply_rotary_pos_emb(x, x, full_cos, full_sin, unsqueeze_dim=1)
    torch.testing.assert_close(ours, expected)
    expected_oss, _ = modeling_gpt_oss.apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=1)
    torch.testing.assert_close(ours, expected_oss)


def test_pairs_rotation_matches_hf_complex_rope():
    rotary = rotary_from_params(PARAMS["llama3"], HEAD_DIM, interleaved=True)
    positions = torch.tensor([0, 3, 64, 999])
    x = torch.randn(4, 2, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    ours = rotary.apply(x, *_angles(rotary, positions))
    angles = positions[:, None].float() * rotary.inv_freq[None]  # [T, D/2]
    freqs_cis = torch.polar(torch.ones_like(angles), angles)[None]  # [1, T, D/2]
    expected, _ = modeling_llama4.apply_rotary_emb(x[None], x[None], freqs_cis)
    torch.testing.assert_close(ours, expected[0])


def test_rotation_preserves_norm_and_position_zero_is_identity():
    rotary = rotary_from_params(PARAMS["default"], HEAD_DIM)
    x = torch.randn(3, 2, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    out = rotary.apply(x, *_angles(rotary, torch.tensor([0, 10, 20])))
    torch.testing.assert_close(out[0], x[0])
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("params, match", [
    ({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}, "dynamic"),
    ({"rope_type": "longrope", "rope_theta": 1e4}, "longrope"),
    ({"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}, "partial"),
])
def test_unsupported_rope_refused(params, match):
    with pytest.raises(ValueError, match=match):
        rotary_from_params(params, HEAD_DIM)
