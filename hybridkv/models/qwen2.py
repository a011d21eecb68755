"""Qwen2 and Mistral: Llama-like pre-norm decoders with an optional sliding window.

Both run the base runner's plain decoder layer (RMSNorm -> attention ->
residual, RMSNorm -> gated MLP -> residual) with rotary embeddings on every
layer and the usual 1/sqrt(head_dim) attention scale. They differ only in
which layers slide:

- Qwen2 reads `config.layer_types`, which its config derives from
  `use_sliding_window`, `sliding_window` and `max_window_layers` (layers
  `i >= max_window_layers` slide when the window is on). A "sliding" layer
  with no window (`sliding_window=None`) attends to everything, as in
  Hugging Face's masks.
- Mistral slides on every layer when `config.sliding_window` is set, and on
  none otherwise.
"""

from __future__ import annotations

from hybridkv.models.base import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    AttentionLayer,
    ModelRunner,
)


class LlamaLikeRunner(ModelRunner):
    """Pre-norm decoder, rotary on every layer, windows from `layer_types()`."""

    def layer_types(self) -> list[str]:
        """Attention type of each layer: "full_attention" or "sliding_attention"."""
        return self.config_layer_types()

    def build_attention_layers(self) -> list[AttentionLayer]:
        num_heads, num_kv_heads, head_dim = self.head_dims()
        rope_key = self.add_rotary("default", self.config.rope_parameters)
        window = getattr(self.config, "sliding_window", None)
        layers = []
        for index, layer_type in enumerate(self.layer_types()):
            if layer_type not in (FULL_ATTENTION, SLIDING_ATTENTION):
                raise ValueError(f"{self.model_type}: layer type {layer_type!r} is not supported")
            layers.append(AttentionLayer(
                name=f"layers.{index}.attn", num_heads=num_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim, scale=head_dim ** -0.5,
                sliding_window=window if layer_type == SLIDING_ATTENTION else None,
                rope_key=rope_key))
        return layers


class Qwen2Runner(LlamaLikeRunner):
    """Qwen2 (q/k/v projections with bias; the window on layers >= max_window_layers)."""

    model_type = "qwen2"


class MistralRunner(LlamaLikeRunner):
    """Mistral (one `sliding_window` for every layer, or none)."""

    model_type = "mistral"

    def layer_types(self) -> list[str]:
        slides = getattr(self.config, "sliding_window", None) is not None
        layer_type = SLIDING_ATTENTION if slides else FULL_ATTENTION
        return [layer_type] * self.config.num_hidden_layers
