"""Built-in tiny presets: small random-weight models of each supported family.

Every preset keeps the structure that matters for prefix caching (which
layers slide, chunk or see everything) at a scale where tests cross windows
and chunks within a few dozen tokens: windows and chunks of 32 tokens,
hidden size 64, vocabulary 512, float32. Weights are drawn from the config's
initializer under `torch.manual_seed(seed)`; `initializer_range` is raised
above the usual 0.02 so that the logits are peaked enough for greedy decoding
to be stable and non-trivial.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

_COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "initializer_range": 0.1,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class Preset:
    """A named tiny model: its Hugging Face `model_type`, config values and context limit."""

    name: str
    model_type: str
    max_model_len: int
    description: str
    config: dict[str, Any] = field(default_factory=dict)

    def build_config(self, **overrides: Any):
        """The Hugging Face config of this preset, with `overrides` applied to its values."""
        values = {**_COMMON, "max_position_embeddings": self.max_model_len, **self.config,
                  **overrides}
        return AutoConfig.for_model(self.model_type, **values)


_PRESETS = (
    Preset("gemma3-tiny", "gemma3_text", 4096,
           "Gemma 3 style: 3 sliding (W=32) + 1 global layer, q/k norm, local/global rope",
           {"num_hidden_layers": 4, "intermediate_size": 128, "sliding_window": 32,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "query_pre_attn_scalar": 32,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0,
                                   "factor": 8.0}}}),
    Preset("gemma2-tiny", "gemma2", 512,
           "Gemma 2 style: alternating sliding (W=32) / global, logit softcapping",
           {"num_hidden_layers": 4, "intermediate_size": 128, "sliding_window": 32,
            "query_pre_attn_scalar": 32, "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0}),
    Preset("qwen2-tiny", "qwen2", 512,
           "Qwen2: 2 full layers then 2 sliding-window (W=32) layers",
           {"num_hidden_layers": 4, "intermediate_size": 128, "use_sliding_window": True,
            "sliding_window": 32, "max_window_layers": 2, "tie_word_embeddings": False}),
    Preset("mistral-tiny", "mistral", 512,
           "Mistral: sliding window (W=32) on every layer",
           {"num_hidden_layers": 3, "intermediate_size": 128, "sliding_window": 32}),
    Preset("llama4-tiny", "llama4_text", 512,
           "Llama 4 text: 3 chunked (C=32) RoPE layers + 1 global NoPE layer, MoE every 2nd",
           {"num_hidden_layers": 4, "intermediate_size": 64, "intermediate_size_mlp": 128,
            "attention_chunk_size": 32, "no_rope_layer_interval": 4,
            "interleave_moe_layer_step": 2, "num_local_experts": 4, "num_experts_per_tok": 1,
            "use_qk_norm": True, "attn_temperature_tuning": True, "floor_scale": 16,
            "attn_scale": 0.1,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 64}}),
    Preset("gpt-oss-tiny", "gpt_oss", 512,
           "gpt-oss: alternating sliding (W=32) / full layers with sinks, MoE, YaRN rope",
           {"num_hidden_layers": 4, "intermediate_size": 64, "sliding_window": 32,
            "num_local_experts": 4, "num_experts_per_tok": 2,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 150_000.0, "factor": 8.0,
                                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                "original_max_position_embeddings": 64}}),
    Preset("jamba-tiny", "jamba", 4096,
           "Jamba: 3 Mamba-1 layers + 1 attention layer (no rope), MoE (4 experts) every 2nd",
           {"num_hidden_layers": 4, "intermediate_size": 128, "attn_layer_period": 4,
            "attn_layer_offset": 2, "expert_layer_period": 2, "expert_layer_offset": 1,
            "num_experts": 4, "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
            "mamba_expand": 2, "mamba_dt_rank": 8}),
    Preset("nemotron-h-tiny", "nemotron_h", 4096,
           "NemotronH: Mamba-2 / MoE / attention (no rope) / Mamba-2 / MLP layers",
           {"layers_block_type": ["linear_attention", "moe", "full_attention",
                                  "linear_attention", "mlp"],
            "intermediate_size": 128, "mamba_num_heads": 8, "mamba_head_dim": 16,
            "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4, "chunk_size": 16,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
            "moe_shared_expert_intermediate_size": 64}),
)

PRESETS: dict[str, Preset] = {preset.name: preset for preset in _PRESETS}


def list_presets() -> list[str]:
    """Names of the built-in presets, e.g. ["gemma3-tiny", "gemma2-tiny", ...]."""
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    """The preset called `name`; ValueError listing the known ones otherwise."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def build_preset_model(name: str, *, seed: int = 0,
                       dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A random-weight Hugging Face model of preset `name`, seeded, in eval mode."""
    config = get_preset(name).build_config()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()
