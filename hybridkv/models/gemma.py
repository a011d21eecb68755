"""Gemma 2 and Gemma 3 (text): sliding-window layers interleaved with global ones.

What sets the Gemma decoders apart from the plain pre-norm one:

- the embedding is scaled by sqrt(hidden_size) (the model's own scaled
  embedding module does it);
- four RMSNorms per layer ((1 + w) scaled): before and after attention,
  before and after the MLP, the "after" norms applied before the residual add;
- attention scale `query_pre_attn_scalar ** -0.5` instead of 1/sqrt(head_dim);
- `config.layer_types` says which layers slide (window `sliding_window`);
- Gemma 2: attention logit softcapping `attn_logit_softcapping` and final
  logit softcapping `final_logit_softcapping`;
- Gemma 3: RMSNorm on each query and key head before the rotary embedding,
  and one rope parameter set per layer type (`config.rope_parameters[type]`,
  e.g. a local base frequency for sliding layers and a scaled global one).
  Hugging Face's Gemma 3 attention does not apply `attn_logit_softcapping`,
  so neither do we; its final logit softcapping is applied when set.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.kernels.attention import AttentionBatch
from hybridkv.models.base import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    AttentionLayer,
    ModelRunner,
    Step,
)


class Gemma2Runner(ModelRunner):
    """Gemma 2: alternating sliding/global layers with attention softcapping."""

    model_type = "gemma2"

    def attention_softcap(self) -> float | None:
        """Softcap on attention logits (Gemma 2 only)."""
        return getattr(self.config, "attn_logit_softcapping", None)

    def rope_key_for(self, layer_type: str) -> str:
        """Register (once) and name the rotary table used by `layer_type` layers."""
        if "default" not in self.rotaries:
            self.add_rotary("default", self.config.rope_parameters)
        return "default"

    def build_attention_layers(self) -> list[AttentionLayer]:
        num_heads, num_kv_heads, head_dim = self.head_dims()
        scale = float(self.config.query_pre_attn_scalar) ** -0.5
        layers = []
        for index, layer_type in enumerate(self.config_layer_types()):
            if layer_type not in (FULL_ATTENTION, SLIDING_ATTENTION):
                raise ValueError(f"{self.model_type}: layer type {layer_type!r} is not supported")
            sliding = layer_type == SLIDING_ATTENTION
            layers.append(AttentionLayer(
                name=f"layers.{index}.attn", num_heads=num_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim, scale=scale,
                sliding_window=self.config.sliding_window if sliding else None,
                softcap=self.attention_softcap(), rope_key=self.rope_key_for(layer_type)))
        return layers

    def decoder_layer(self, index: int, layer: nn.Module, hidden: torch.Tensor, step: Step,
                      batch: AttentionBatch) -> torch.Tensor:
        """Sandwich norms: h += post_norm(attn(pre_norm(h))); the same around the MLP."""
        norms = self.norms
        attn_out = self.self_attention(index, layer.self_attn,
                                       norms.apply(layer.input_layernorm, hidden), step, batch)
        hidden, x = norms.residual(hidden, attn_out, layer.post_attention_layernorm,
                                   layer.pre_feedforward_layernorm)
        assert x is not None
        mlp_out = self.mlp(layer.mlp, x)
        hidden, _ = norms.residual(hidden, mlp_out, layer.post_feedforward_layernorm, None,
                                   in_place=True)  # this layer's own sum: written over
        return hidden


class Gemma3Runner(Gemma2Runner):
    """Gemma 3 text: q/k RMSNorm and per-layer-type rope parameters."""

    model_type = "gemma3_text"

    def attention_softcap(self) -> float | None:
        return None

    def rope_key_for(self, layer_type: str) -> str:
        if layer_type not in self.rotaries:
            params = self.config.rope_parameters.get(layer_type)
            if params is None:
                raise ValueError(f"gemma3_text: config.rope_parameters has no entry for "
                                 f"{layer_type!r}")
            self.add_rotary(layer_type, params)
        return layer_type

    def transform_qk(self, index: int, attn: nn.Module, q: torch.Tensor, k: torch.Tensor,
                     step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm each head of q [T, Hq, D] and k [T, Hkv, D], then rotate."""
        return self.norm_rope(index, q, k, step, attn.q_norm, attn.k_norm)
