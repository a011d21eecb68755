"""NemotronH: a per-layer pattern of Mamba-2, attention, MLP and MoE blocks.

The decoder (`NemotronHForCausalLM`, model_type "nemotron_h"):

- `config.layers_block_type[i]` (the "M*-E" pattern) picks each block's one
  mixer: "linear_attention" (Mamba-2), "full_attention" (no rope),
  "mlp" (relu^2 MLP) or "moe" (sigmoid-routed experts plus a shared
  expert); only Mamba-2 and attention blocks hold cache;
- every block: h += mixer(norm(h)); `norm_f` before the LM head;
- the Mamba-2 mixer: `in_proj` -> (gate z, xBC, dt); causal depthwise conv +
  activation on xBC; split into x [nheads, headdim], B and C [n_groups,
  d_state]; SSD scan with dt = clamp(softplus(dt + `dt_bias`),
  min=`time_step_min`), A = -exp(`A_log`) per head, skip D per head;
  grouped RMSNorm of y * SiLU(z) (the mixer's own `norm`); `out_proj`.

Hugging Face's single-token cached update leaves dt unclamped while its
full-sequence scan clamps it; we clamp in both, so outputs match the
full-sequence forward however the sequence is cut into steps.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.models.mamba_mixer import (
    ATTENTION,
    FFN,
    MAMBA,
    HybridRunner,
    HybridStep,
    Mamba2Inputs,
    MambaLayer,
    mamba2_scan,
    mamba_conv,
)

BLOCK_KINDS = {"linear_attention": MAMBA, "full_attention": ATTENTION, "mlp": FFN, "moe": FFN}


class NemotronHRunner(HybridRunner):
    """NemotronH decoder over paged attention KV and Mamba-2 state blocks."""

    model_type = "nemotron_h"

    def layer_kinds(self) -> list[str]:
        return self.block_kinds(BLOCK_KINDS, "mamba_hidden_act")

    def build_mamba_layer(self, index: int) -> MambaLayer:
        mixer = self.decoder.layers[index].mixer
        ssm_shape = (mixer.num_heads, mixer.head_dim, mixer.ssm_state_size)
        return MambaLayer(f"layers.{index}.mamba",
                          conv_shape=(mixer.conv_dim, mixer.conv_kernel_size - 1),
                          ssm_shape=ssm_shape)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embeddings(input_ids)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.norm_f(hidden)

    def hybrid_layer(self, index: int, layer: nn.Module, hidden: torch.Tensor,
                     ctx: HybridStep) -> torch.Tensor:
        """h += mixer(norm(h)) with the block's one mixer. hidden: [T, hidden]."""
        x = layer.norm(hidden.to(layer.norm.weight.dtype))
        kind = self.kinds[index]
        if kind == MAMBA:
            out = self.mamba_mixer(index, layer.mixer, x, ctx)
        elif kind == ATTENTION:
            out = self.attend(index, layer.mixer, x, ctx)
        else:
            out = layer.mixer(x[None])[0]  # MLP or MoE on [1, T, hidden]
        return hidden + out

    def mamba_mixer(self, index: int, mixer: nn.Module, x: torch.Tensor,
                    ctx: HybridStep) -> torch.Tensor:
        """The Mamba-2 mixer on x [T, hidden] -> [T, hidden]."""
        conv_cache, ssm_cache, batch = self.mamba_views(index, ctx)
        num_tokens = x.shape[0]
        d_inner, groups_state = mixer.intermediate_size, mixer.n_groups * mixer.ssm_state_size
        gate, xbc, dt = mixer.in_proj(x).split([d_inner, mixer.conv_dim, mixer.num_heads], -1)
        xbc = mamba_conv(xbc, conv_cache, batch, mixer.conv1d.weight[:, 0], mixer.conv1d.bias,
                         self.config.mamba_hidden_act)  # [T, conv_dim]
        u, B, C = xbc.split([d_inner, groups_state, groups_state], dim=-1)
        inputs = Mamba2Inputs(
            x=u.reshape(num_tokens, mixer.num_heads, mixer.head_dim), dt=dt,
            A=-torch.exp(mixer.A_log.float()),
            B=B.reshape(num_tokens, mixer.n_groups, mixer.ssm_state_size),
            C=C.reshape(num_tokens, mixer.n_groups, mixer.ssm_state_size),
            D=mixer.D, dt_bias=mixer.dt_bias, chunk_size=int(mixer.chunk_size),
            dt_limit=_float_pair(mixer.time_step_limit))
        y = mamba2_scan(inputs, ssm_cache, batch)  # [T, nheads, headdim]
        y = mixer.norm(y.reshape(num_tokens, d_inner), gate)
        return mixer.out_proj(y.to(x.dtype))


def _float_pair(limit) -> tuple[float, float]:
    low, high = limit
    return float(low), float(high)
