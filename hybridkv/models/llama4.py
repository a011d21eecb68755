"""Llama 4 text: chunked local attention with RoPE, global NoPE layers, MoE.

The decoder layer is the plain pre-norm one; what is particular:

- `config.layer_types`: "chunked_attention" layers see only their own chunk
  of `attention_chunk_size` tokens (up to the query); "full_attention"
  layers see everything. With `attention_chunk_size=None` every layer is
  global.
- `config.no_rope_layers[i]` is 1 where layer i uses RoPE (the interleaved,
  complex-pair layout with the config's rope scaling, e.g. llama3) and 0 on
  NoPE layers.
- `use_qk_norm`: an L2-style RMSNorm without weight on each query and key
  head, after RoPE, on the RoPE layers only.
- `attn_temperature_tuning`: on NoPE layers the query at absolute position p
  is multiplied by `1 + attn_scale * log1p(floor((p + 1) / floor_scale))`.
- MoE layers (`config.moe_layers`, interleaved with dense ones by
  `interleave_moe_layer_step`) route each token to its top-k experts with
  sigmoid gates and add a shared expert; we call the model's own MoE block.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.models.base import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    AttentionLayer,
    ModelRunner,
    Step,
)


class Llama4Runner(ModelRunner):
    """Llama 4 text decoder (`Llama4ForCausalLM`, model_type "llama4_text")."""

    model_type = "llama4_text"

    def build_attention_layers(self) -> list[AttentionLayer]:
        cfg = self.config
        num_heads, num_kv_heads, head_dim = self.head_dims()
        rope_key = self.add_rotary("default", cfg.rope_parameters, interleaved=True)
        chunk_size = getattr(cfg, "attention_chunk_size", None)
        layers = []
        for index, layer_type in enumerate(self.config_layer_types()):
            if layer_type not in (FULL_ATTENTION, CHUNKED_ATTENTION):
                raise ValueError(f"llama4_text: layer type {layer_type!r} is not supported")
            layers.append(AttentionLayer(
                name=f"layers.{index}.attn", num_heads=num_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim, scale=head_dim ** -0.5,
                chunk_size=chunk_size if layer_type == CHUNKED_ATTENTION else None,
                rope_key=rope_key if cfg.no_rope_layers[index] else None))
        return layers

    def transform_qk(self, index: int, attn: nn.Module, q: torch.Tensor, k: torch.Tensor,
                     step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE then qk norm on RoPE layers; temperature tuning of q on NoPE layers."""
        q, k = self.apply_rope(index, q, k, step)
        qk_norm = getattr(attn, "qk_norm", None)
        if qk_norm is not None:
            q, k = qk_norm(q), qk_norm(k)
        is_nope = self.attn_layers[index].rope_key is None
        if is_nope and self.config.attn_temperature_tuning:
            q = (q * self.attention_temperature(step.positions)[:, None, None]).to(q.dtype)
        return q, k

    def attention_temperature(self, positions: torch.Tensor) -> torch.Tensor:
        """Query scale per token, float32 [T].

        1 + attn_scale * log1p(floor((p + 1) / floor_scale)) at absolute position p.
        """
        cfg = self.config
        steps = torch.floor((positions.float() + 1.0) / cfg.floor_scale)
        return torch.log1p(steps) * cfg.attn_scale + 1.0

    def feed_forward(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Dense MLP or MoE block (which returns (output, router_logits)) on x [T, hidden]."""
        out = layer.feed_forward(x)
        return out[0] if layer.is_moe_layer else out
