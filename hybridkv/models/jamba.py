"""Jamba: Mamba-1 layers interleaved with attention layers, MoE feed-forwards.

The decoder (`JambaForCausalLM`, model_type "jamba"):

- layer i is attention when `i % attn_layer_period == attn_layer_offset`,
  else Mamba (`config.layers_block_type`); attention has no positional
  encoding at all (no rope: the Mamba layers carry order);
- every layer: h += mixer(input_layernorm(h)); h += ffn(pre_ff_layernorm(h)),
  the ffn a top-k MoE when `i % expert_layer_period == expert_layer_offset`
  (`config.layers_num_experts[i] > 1`), else a gated MLP; we call the
  model's own modules for both;
- the Mamba mixer: `in_proj` -> (x, gate); causal depthwise conv + SiLU on
  x; `x_proj` -> (dt, B, C), each RMS-normalised (`dt_layernorm`,
  `b_layernorm`, `c_layernorm`: what sets Jamba apart from plain Mamba);
  dt = `dt_proj.weight` @ dt, discretised as softplus(dt + `dt_proj.bias`);
  A = -exp(`A_log`); selective scan with skip D and gate SiLU(gate);
  `out_proj`;
- `final_layernorm` before the LM head.

Hugging Face's cached multi-token forward starts every Mamba scan from a
zero state; ours starts from the state in the paged cache.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.models.mamba_mixer import (
    ATTENTION,
    MAMBA,
    HybridRunner,
    HybridStep,
    Mamba1Inputs,
    MambaLayer,
    mamba1_scan,
    mamba_conv,
)


class JambaRunner(HybridRunner):
    """Jamba decoder over paged attention KV and Mamba state blocks."""

    model_type = "jamba"

    def layer_kinds(self) -> list[str]:
        return self.block_kinds({"attention": ATTENTION, "mamba": MAMBA}, "hidden_act")

    def build_mamba_layer(self, index: int) -> MambaLayer:
        mixer = self.decoder.layers[index].mamba
        d_inner, d_state = mixer.intermediate_size, mixer.ssm_state_size
        return MambaLayer(f"layers.{index}.mamba", conv_shape=(d_inner, mixer.conv_kernel_size - 1),
                          ssm_shape=(d_inner, d_state))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(input_ids)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.final_layernorm(hidden)

    def hybrid_layer(self, index: int, layer: nn.Module, hidden: torch.Tensor,
                     ctx: HybridStep) -> torch.Tensor:
        """h += mixer(input_layernorm(h)); h += ffn(pre_ff_layernorm(h)). hidden: [T, hidden]."""
        x = layer.input_layernorm(hidden)
        if index in self.mamba_layers:
            hidden = hidden + self.mamba_mixer(index, layer.mamba, x, ctx)
        else:
            hidden = hidden + self.attend(index, layer.self_attn, x, ctx)
        ffn_out = layer.feed_forward(layer.pre_ff_layernorm(hidden)[None])  # [1, T, hidden]
        return hidden + ffn_out[0]

    def mamba_mixer(self, index: int, mixer: nn.Module, x: torch.Tensor,
                    ctx: HybridStep) -> torch.Tensor:
        """The Mamba-1 mixer with dt/B/C norms on x [T, hidden] -> [T, hidden]."""
        conv_cache, ssm_cache, batch = self.mamba_views(index, ctx)
        u, gate = mixer.in_proj(x).chunk(2, dim=-1)  # [T, d_inner] each
        u = mamba_conv(u, conv_cache, batch, mixer.conv1d.weight[:, 0], mixer.conv1d.bias,
                       self.config.hidden_act)
        dt, B, C = mixer.x_proj(u).split(
            [mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size], dim=-1)
        dt = nn.functional.linear(mixer.dt_layernorm(dt), mixer.dt_proj.weight)  # [T, d_inner]
        bias = mixer.dt_proj.bias
        inputs = Mamba1Inputs(
            u=u, delta=dt, A=-torch.exp(mixer.A_log.float()), B=mixer.b_layernorm(B),
            C=mixer.c_layernorm(C), D=mixer.D.float(), z=gate,
            delta_bias=None if bias is None else bias.float())
        y = mamba1_scan(inputs, ssm_cache, batch)  # [T, d_inner]
        return mixer.out_proj(y.to(x.dtype))
