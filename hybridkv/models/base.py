"""The model runner base: a Hugging Face decoder run over a paged KV cache.

A runner shares the weights of a `transformers` causal LM. Position-independent
pieces (embedding, norms, projections, MLP / MoE blocks, the LM head) are the
model's own modules applied to flattened `[T, hidden]` tensors; rotary
embeddings, attention and the KV cache are ours. Every step is a flattened
batch: `T` new tokens of any number of sequences, each attention layer reading
and writing its own paged K/V tensors through the block table of its group.

Subclasses describe their attention layers (`build_attention_layers`) and, where
the family differs from the plain pre-norm decoder, override the hooks
`decoder_layer`, `transform_qk`, `attention_sinks` or `feed_forward`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from hybridkv.kernels.attention import AttentionBatch, paged_attention, write_kv
from hybridkv.kernels.norm_rope import norm_rope_qk
from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    dtype_name,
)
from hybridkv.models.fused_norm import FusedNorms
from hybridkv.models.mamba_batch import MambaBatch
from hybridkv.models.packed_linear import PackedLinears, gated_mlp_parts
from hybridkv.models.rope import RotaryEmbedding, rotary_from_params

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
CHUNKED_ATTENTION = "chunked_attention"


@dataclass(frozen=True)
class AttentionLayer:
    """How one attention layer reads the paged cache.

    `sliding_window` W: a query at p sees keys in (p - W, p]. `chunk_size` C: a
    query sees keys of its own chunk up to itself. `rope_key` names the rotary
    table in `ModelRunner.rotaries` (None: no positional encoding, NoPE).
    """

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None = None
    chunk_size: int | None = None
    softcap: float | None = None
    rope_key: str | None = "default"

    def kv_cache_spec(self, block_size: int, dtype: str) -> KVCacheSpec:
        """The spec of this layer's cache (ValueError for a chunk not a multiple of block_size)."""
        shape = {"num_kv_heads": self.num_kv_heads, "head_size": self.head_dim, "dtype": dtype}
        if self.sliding_window is not None:
            return SlidingWindowSpec(block_size, sliding_window=self.sliding_window, **shape)
        if self.chunk_size is not None:
            return ChunkedLocalAttentionSpec(block_size, attention_chunk_size=self.chunk_size,
                                             **shape)
        return FullAttentionSpec(block_size, **shape)


class Step(NamedTuple):
    """Per-step values shared by every layer."""

    positions: torch.Tensor                                  # int64 [T]
    angles: dict[str, tuple[torch.Tensor, torch.Tensor]]     # rope key -> (cos, sin) [T, D/2]


class ModelRunner(ABC):
    """Runs a Hugging Face causal LM step by step over a paged KV cache.

    Attributes: `model_type`, `vocab_size`, `max_model_len`, `eos_token_ids`,
    `dtype`, `attn_layers` (one `AttentionLayer` per decoder layer, in order).
    """

    model_type: str = ""

    def __init__(self, model: nn.Module) -> None:
        config = model.config
        if self.model_type and config.model_type != self.model_type:
            raise ValueError(f"{type(self).__name__} runs model_type {self.model_type!r}, "
                             f"got {config.model_type!r}")
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention=True is not supported (causal only)")
        self.model = model.eval()
        self.config = config
        self.decoder = model.model
        self.model_type = config.model_type
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = int(config.max_position_embeddings)
        self.eos_token_ids = _eos_token_ids(model)
        self.dtype = next(model.parameters()).dtype
        # read once: a transformers config's attribute lookup costs microseconds per step
        self.final_logit_softcap = getattr(config, "final_logit_softcapping", None)
        self.rotaries: dict[str, RotaryEmbedding] = {}
        self.attn_layers = self.build_attention_layers()
        self.kv_caches: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.linears = PackedLinears()  # empty: every projection runs its own module
        self.norms = FusedNorms()  # empty: every norm runs its own module

    @classmethod
    def from_hf(cls, model: nn.Module) -> ModelRunner:
        """A runner sharing `model`'s weights (the model is put in eval mode)."""
        return cls(model)

    def prepack_weights(self) -> int:
        """Pack the attention projections, gated MLPs and LM head for CPU steps of 2
        tokens or more (`packed_linear`); returns how many weights were packed (0 where oneDNN
        cannot pack them, e.g. off CPU or not float32). Costs a second copy of each."""
        for layer in self.decoder.layers:
            attn = getattr(layer, "self_attn", None)
            qkv = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj")]
            self._pack(qkv, getattr(attn, "o_proj", None))
            self._pack(*_gate_up_down(getattr(layer, "mlp", None)))
        self.linears.add(getattr(self.model, "lm_head", None))
        self.norms.add_all(self.model)
        return len(self.linears)

    def _pack(self, together: list, alone: nn.Module | None) -> None:
        """Pack `together` as one stacked matrix (each alone when that is refused), and
        `alone` by itself."""
        if not self.linears.add_fused(together) and not self.linears.is_fused(together):
            for module in together:
                self.linears.add(module)
        self.linears.add(alone)

    # ----------------------------------------------------------------- layout
    @abstractmethod
    def build_attention_layers(self) -> list[AttentionLayer]:
        """One `AttentionLayer` per decoder layer; fills `self.rotaries`."""

    def head_dims(self) -> tuple[int, int, int]:
        """(num_heads, num_kv_heads, head_dim) from the config."""
        cfg = self.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return cfg.num_attention_heads, num_kv_heads, head_dim

    def config_layer_types(self) -> list[str]:
        """`config.layer_types`, checked against the known attention types."""
        layer_types = list(self.config.layer_types)
        known = (FULL_ATTENTION, SLIDING_ATTENTION, CHUNKED_ATTENTION)
        if len(layer_types) != self.config.num_hidden_layers:
            raise ValueError(f"config.layer_types has {len(layer_types)} entries for "
                             f"{self.config.num_hidden_layers} layers")
        for layer_type in layer_types:
            if layer_type not in known:
                raise ValueError(f"layer type {layer_type!r} is not supported; known: {known}")
        return layer_types

    def add_rotary(self, key: str, params: Mapping, *, interleaved: bool = False) -> str:
        """Register the rotary table of `params` under `key`; returns `key`."""
        head_dim = self.head_dims()[2]
        self.rotaries[key] = rotary_from_params(
            params, head_dim, max_position_embeddings=self.config.max_position_embeddings,
            interleaved=interleaved)
        return key

    def kv_cache_specs(self, block_size: int) -> dict[str, KVCacheSpec]:
        """Layer name -> spec, e.g. {"layers.0.attn": SlidingWindowSpec(...), ...}."""
        dtype = dtype_name(self.dtype)
        return {layer.name: layer.kv_cache_spec(block_size, dtype) for layer in self.attn_layers}

    def bind_kv_cache(self, kv_caches: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Use these (k_cache, v_cache) tensors, each [num_blocks, block_size, Hkv, D].

        Raises ValueError when a layer is missing or a tensor has the wrong shape.
        """
        for layer in self.attn_layers:
            if layer.name not in kv_caches:
                raise ValueError(f"bind_kv_cache: no cache for layer {layer.name!r}")
            for tensor in kv_caches[layer.name]:
                if tensor.dim() != 4 or tuple(tensor.shape[2:]) != (layer.num_kv_heads,
                                                                     layer.head_dim):
                    raise ValueError(
                        f"bind_kv_cache: {layer.name} cache has shape {tuple(tensor.shape)}, "
                        f"expected [num_blocks, block_size, {layer.num_kv_heads}, "
                        f"{layer.head_dim}]")
        self.kv_caches = {layer.name: tuple(kv_caches[layer.name]) for layer in self.attn_layers}

    # ---------------------------------------------------------------- forward
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn_batches: Mapping[str, AttentionBatch],
                logits_indices: torch.Tensor,
                mamba_batches: Mapping[str, MambaBatch] | None = None) -> torch.Tensor:
        """Run one step; float32 logits [S, vocab] of the rows `logits_indices`.

        `input_ids`, `positions`: int64 [T]; `attn_batches`: layer name -> batch
        of its group. K/V of the new tokens are written to the bound caches.
        `mamba_batches`: layer name -> state instructions, for runners with
        Mamba layers (see `mamba_mixer.HybridRunner`); ValueError when given
        to a runner without any.
        """
        if mamba_batches:
            raise ValueError(f"{type(self).__name__} has no Mamba layers, got mamba_batches "
                             f"for {sorted(mamba_batches)}")
        self._check_step(input_ids, positions, attn_batches)
        step = Step(positions, {key: rotary.cos_sin(positions)
                                for key, rotary in self.rotaries.items()})
        hidden = self.decoder.embed_tokens(input_ids)  # [T, hidden]
        for index, layer in enumerate(self.decoder.layers):
            batch = attn_batches[self.attn_layers[index].name]
            hidden = self.decoder_layer(index, layer, hidden, step, batch)
        hidden = self.norms.apply(self.decoder.norm, hidden[logits_indices])  # [S, hidden]
        return self.compute_logits(hidden)

    def _check_step(self, input_ids: torch.Tensor, positions: torch.Tensor,
                    attn_batches: Mapping[str, AttentionBatch]) -> None:
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(f"input_ids and positions must be 1-D of one length, got "
                             f"{tuple(input_ids.shape)} and {tuple(positions.shape)}")
        if not self.kv_caches:
            raise ValueError("forward before bind_kv_cache")
        missing = [layer.name for layer in self.attn_layers if layer.name not in attn_batches]
        if missing:
            raise ValueError(f"attn_batches lacks layers {missing}")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head (+ final logit softcapping when the config has it) -> float32 [S, vocab]."""
        logits = self.linears.apply(self.model.lm_head, hidden)
        cap = self.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    # ------------------------------------------------------------------ hooks
    def decoder_layer(self, index: int, layer: nn.Module, hidden: torch.Tensor, step: Step,
                      batch: AttentionBatch) -> torch.Tensor:
        """Pre-norm decoder layer: h += attn(norm(h)); h += ffn(norm(h)). hidden: [T, hidden]."""
        norms = self.norms
        attn_out = self.self_attention(index, layer.self_attn,
                                       norms.apply(layer.input_layernorm, hidden), step, batch)
        hidden, x = norms.residual(hidden, attn_out, None, layer.post_attention_layernorm)
        assert x is not None
        return hidden + self.feed_forward(layer, x)

    def feed_forward(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The layer's MLP on x [T, hidden]."""
        return self.mlp(layer.mlp, x)

    def mlp(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """`mlp(x)`, its projections through `self.linears` when it is a packed gated MLP."""
        parts = gated_mlp_parts(mlp) if len(self.linears) else None
        if parts is None:
            return mlp(x)
        gate, up, down = parts
        gate_out, up_out = self.linears.apply_all((gate, up), x)
        return self.linears.apply(down, mlp.act_fn(gate_out) * up_out)

    def self_attention(self, index: int, attn: nn.Module, x: torch.Tensor, step: Step,
                       batch: AttentionBatch) -> torch.Tensor:
        """Project, encode positions, write K/V, attend over the cache, project out."""
        spec = self.attn_layers[index]
        num_tokens = x.shape[0]
        q, k, v = self.linears.apply_all((attn.q_proj, attn.k_proj, attn.v_proj), x)
        q = q.view(num_tokens, spec.num_heads, spec.head_dim)  # [T, Hq, D]
        k = k.view(num_tokens, spec.num_kv_heads, spec.head_dim)  # [T, Hkv, D]
        v = v.view(num_tokens, spec.num_kv_heads, spec.head_dim)  # [T, Hkv, D]
        q, k = self.transform_qk(index, attn, q, k, step)
        k_cache, v_cache = self.kv_caches[spec.name]
        write_kv(k, v, k_cache, v_cache, batch.slot_mapping, batch.plans)
        out = paged_attention(q, k_cache, v_cache, batch, scale=spec.scale,
                              sliding_window=spec.sliding_window, chunk_size=spec.chunk_size,
                              softcap=spec.softcap, sinks=self.attention_sinks(attn))
        return self.linears.apply(attn.o_proj,
                                  out.reshape(num_tokens, spec.num_heads * spec.head_dim))

    def transform_qk(self, index: int, attn: nn.Module, q: torch.Tensor, k: torch.Tensor,
                     step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """Positional encoding of q [T, Hq, D] and k [T, Hkv, D]; default: rotary if any."""
        return self.apply_rope(index, q, k, step)

    def apply_rope(self, index: int, q: torch.Tensor, k: torch.Tensor,
                   step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k by the layer's rotary table (unchanged for NoPE layers)."""
        return self.norm_rope(index, q, k, step)

    def norm_rope(self, index: int, q: torch.Tensor, k: torch.Tensor, step: Step,
                  q_norm: nn.Module | None = None, k_norm: nn.Module | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm each head of q [T, Hq, D] and k [T, Hkv, D] by `q_norm` / `k_norm`
        (where given), then rotate them by the layer's rotary table (none: NoPE). One
        kernel call, in place, where `norm_rope_qk` takes them; else module by module."""
        key = self.attn_layers[index].rope_key
        rotary = None if key is None else self.rotaries[key]
        if rotary is not None and not rotary.interleaved:
            norms = [None if m is None else self.norms.weight(m, q) for m in (q_norm, k_norm)]
            if all(w is not None or m is None for w, m in zip(norms, (q_norm, k_norm))):
                cos, sin = step.angles[key]  # type: ignore[index]
                done = norm_rope_qk(q, k, cos, sin, norms[0], norms[1])
                if done is not None:
                    return done
        if q_norm is not None:
            q = self.norms.apply(q_norm, q)
        if k_norm is not None:
            k = self.norms.apply(k_norm, k)
        if rotary is None:
            return q, k
        cos, sin = step.angles[key]  # type: ignore[index]
        return rotary.apply(q, cos, sin), rotary.apply(k, cos, sin)

    def attention_sinks(self, attn: nn.Module) -> torch.Tensor | None:
        """Per-query-head sink logits [Hq] joining the softmax denominator, or None."""
        return None


def _gate_up_down(mlp: nn.Module | None) -> tuple[list, nn.Module | None]:
    """([gate_proj, up_proj], down_proj) of a gated MLP, else ([], None)."""
    parts = gated_mlp_parts(mlp)
    return ([], None) if parts is None else ([parts[0], parts[1]], parts[2])


def _eos_token_ids(model: nn.Module) -> tuple[int, ...]:
    """End-of-sequence ids from the generation config, else from the model config."""
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return ()
    return (int(eos),) if isinstance(eos, int) else tuple(int(token) for token in eos)
