"""gpt-oss: sliding-window layers alternating with full ones, learned sinks, MoE.

- `config.layer_types` alternates "sliding_attention" (window
  `sliding_window`) and "full_attention".
- Every layer has learned attention sinks: one logit per query head that
  joins the softmax denominator and carries no value, so a query may put
  weight "nowhere". The kernel takes them as `sinks`.
- Rotary embeddings in the halves layout with YaRN scaling (its attention
  factor scales cos and sin).
- The MLP is a top-k MoE whose experts use a clamped SwiGLU
  (`(clamp(up) + 1) * gate * sigmoid(alpha * gate)`); we call the model's own
  MoE block on the flattened tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.models.base import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    AttentionLayer,
    ModelRunner,
)


class GptOssRunner(ModelRunner):
    """gpt-oss decoder (`GptOssForCausalLM`, model_type "gpt_oss")."""

    model_type = "gpt_oss"

    def build_attention_layers(self) -> list[AttentionLayer]:
        num_heads, num_kv_heads, head_dim = self.head_dims()
        rope_key = self.add_rotary("default", self.config.rope_parameters)
        layers = []
        for index, layer_type in enumerate(self.config_layer_types()):
            if layer_type not in (FULL_ATTENTION, SLIDING_ATTENTION):
                raise ValueError(f"gpt_oss: layer type {layer_type!r} is not supported")
            sliding = layer_type == SLIDING_ATTENTION
            layers.append(AttentionLayer(
                name=f"layers.{index}.attn", num_heads=num_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim, scale=head_dim ** -0.5,
                sliding_window=self.config.sliding_window if sliding else None,
                rope_key=rope_key))
        return layers

    def attention_sinks(self, attn: nn.Module) -> torch.Tensor:
        """The layer's learned sink logits, [num_heads]."""
        return attn.sinks

    def feed_forward(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The MoE block on x [T, hidden] (it expects [batch, seq, hidden] and returns a pair)."""
        out, _router_scores = layer.mlp(x[None])
        return out[0]
