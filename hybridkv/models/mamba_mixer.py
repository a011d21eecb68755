"""Mamba layers over paged state blocks, and the runner base of attention/Mamba hybrids.

A Mamba layer keeps, per block, a conv state (the last `d_conv - 1` conv
inputs, oldest first) and an SSM state. A step's `MambaBatch` says, per
sequence, where the initial state comes from (a cache-hit source block, the
live block, or zero), which checkpoint blocks receive the state after `k` of
the step's tokens, and the live block that receives the final state.

The position-independent parts of a mixer (projections, norms) run on the
flattened `[T, ...]` rows of the whole step; the two stateful parts, the
causal conv and the scan, run here:

- a prefill span per sequence, in batch order (a later sequence may start
  from a checkpoint an earlier one writes in this step), the kernels
  emitting the checkpoint states at `emit_positions`;
- a decode batch (one token per sequence, no sequence reading a block
  written in this step) as one batched single-token update.

`HybridRunner` is the `ModelRunner` for decoders made of attention, Mamba
and cache-free (MLP / MoE) layers: its specs, cache binding and forward add
the Mamba layers (`"layers.{i}.mamba"`) to the attention ones.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from hybridkv.kernels.attention import AttentionBatch
from hybridkv.kernels.conv1d import SpanOutput
from hybridkv.kernels.mamba_gpu import (
    causal_conv1d_fn,
    causal_conv1d_update,
    mamba_chunk_scan_combined,
    selective_scan_fn,
    selective_state_update,
    ssd_state_update,
)
from hybridkv.kv_cache.specs import KVCacheSpec, MambaSpec
from hybridkv.models.base import AttentionLayer, ModelRunner, Step
from hybridkv.models.mamba_batch import MambaBatch

ATTENTION, MAMBA, FFN = "attention", "mamba", "ffn"

# (rows of the sequence, initial state [1, *shape], emit positions) -> SpanOutput, out [L, ...]
SpanFn = Callable[[slice, torch.Tensor, list[int]], SpanOutput]
# state [S, *shape] (updated in place) -> out [S, ...]
DecodeFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MambaLayer:
    """The state tensors of one Mamba layer, per block.

    `conv_shape`: `(conv channels, d_conv - 1)`; `ssm_shape`: `(d_inner,
    d_state)` for Mamba-1, `(nheads, headdim, d_state)` for Mamba-2.
    """

    name: str
    conv_shape: tuple[int, int]
    ssm_shape: tuple[int, ...]

    def kv_cache_spec(self, block_size: int) -> MambaSpec:
        """`MambaSpec(block_size, shapes=(conv_shape, ssm_shape))`, float32 states."""
        return MambaSpec(block_size, shapes=(self.conv_shape, self.ssm_shape), dtype="float32")


# ------------------------------------------------------------------------------ state I/O
def seq_rows(batch: MambaBatch, s: int) -> slice:
    """Rows of sequence `s` in the flattened step."""
    return slice(batch.query_start_loc[s], batch.query_start_loc[s + 1])


def initial_state(cache: torch.Tensor, batch: MambaBatch, s: int) -> torch.Tensor:
    """Float32 copy of sequence `s`'s start state: source block, live block or zeros."""
    # cache: [num_blocks, *shape] -> [*shape]
    if batch.source_blocks[s] is not None:
        return cache[batch.source_blocks[s]].float().clone()
    if batch.has_initial_state[s]:
        return cache[batch.live_blocks[s]].float().clone()
    return cache.new_zeros(cache.shape[1:], dtype=torch.float32)


def store_states(cache: torch.Tensor, batch: MambaBatch, s: int, final: torch.Tensor,
                 emitted: torch.Tensor) -> None:
    """Write the checkpoint states `emitted` [E, *shape] and the final state [*shape]."""
    for (_, block_id), state in zip(batch.checkpoints[s], emitted):
        cache[block_id] = state.to(cache.dtype)
    cache[batch.live_blocks[s]] = final.to(cache.dtype)


def is_decode_batch(batch: MambaBatch) -> bool:
    """One token per sequence and no sequence reading a block written in this step."""
    starts = batch.query_start_loc
    if any(b - a != 1 for a, b in zip(starts, starts[1:])):
        return False
    written = {block_id for ckpts in batch.checkpoints for _, block_id in ckpts}
    return not written.intersection(batch.source_blocks)


def run_stateful(cache: torch.Tensor, batch: MambaBatch, span: SpanFn,
                 decode: DecodeFn) -> torch.Tensor:
    """Run a stateful op over the step: batched decode when possible, else span by span."""
    if is_decode_batch(batch):
        return _run_decode(cache, batch, decode)
    outs = []
    for s in range(batch.num_seqs):
        start = initial_state(cache, batch, s)[None]  # [1, *shape]
        offsets = [k for k, _ in batch.checkpoints[s]]
        result = span(seq_rows(batch, s), start, offsets)
        store_states(cache, batch, s, result.final_state[0], result.emitted_states[0])
        outs.append(result.out)
    return torch.cat(outs)


def _run_decode(cache: torch.Tensor, batch: MambaBatch, decode: DecodeFn) -> torch.Tensor:
    device = cache.device
    sources = [live if src is None else src
               for src, live in zip(batch.source_blocks, batch.live_blocks)]
    keep = [src is not None or has for src, has in zip(batch.source_blocks,
                                                       batch.has_initial_state)]
    state = cache[torch.tensor(sources, device=device)].float()  # [S, *shape]
    keep_mask = torch.tensor(keep, device=device).view(-1, *[1] * (state.dim() - 1))
    state = torch.where(keep_mask, state, torch.zeros((), device=device))  # NaN-safe zeroing
    start = state.clone()
    out = decode(state)  # state now holds the state after the token
    cache[torch.tensor(batch.live_blocks, device=device)] = state.to(cache.dtype)
    for s, ckpts in enumerate(batch.checkpoints):
        for k, block_id in ckpts:
            cache[block_id] = (start if k == 0 else state)[s].to(cache.dtype)
    return out


# ------------------------------------------------------------------------ stateful ops
def mamba_conv(x: torch.Tensor, cache: torch.Tensor, batch: MambaBatch, weight: torch.Tensor,
               bias: torch.Tensor | None, activation: str | None) -> torch.Tensor:
    """Causal depthwise conv of x [T, C] over the step; cache [num_blocks, C, d_conv - 1]."""
    def span(rows: slice, start: torch.Tensor, offsets: list[int]) -> SpanOutput:
        res = causal_conv1d_fn(x[rows].T[None], weight, bias, initial_states=start.to(x.dtype),
                               activation=activation, emit_positions=offsets)
        return res._replace(out=res.out[0].T)  # [L, C]

    def decode(state: torch.Tensor) -> torch.Tensor:
        return causal_conv1d_update(x, state, weight, bias, activation)  # [S, C]

    return run_stateful(cache, batch, span, decode)


class Mamba1Inputs(NamedTuple):
    """Selective scan inputs: u, delta, z [T, d_inner]; B, C [T, d_state]; A [d_inner,
    d_state]; D, delta_bias [d_inner] (delta is discretised as softplus(delta + bias))."""

    u: torch.Tensor
    delta: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    delta_bias: torch.Tensor | None


def mamba1_scan(inp: Mamba1Inputs, cache: torch.Tensor, batch: MambaBatch) -> torch.Tensor:
    """Mamba-1 selective scan over the step; cache [num_blocks, d_inner, d_state]; out [T, d]."""
    def span(rows: slice, start: torch.Tensor, offsets: list[int]) -> SpanOutput:
        def cols(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[rows].T[None]  # [1, features, L]

        res = selective_scan_fn(cols(inp.u), cols(inp.delta), inp.A, cols(inp.B), cols(inp.C),
                                inp.D, cols(inp.z), inp.delta_bias, delta_softplus=True,
                                initial_state=start, emit_positions=offsets)
        return res._replace(out=res.out[0].T)  # [L, d_inner]

    def decode(state: torch.Tensor) -> torch.Tensor:
        return selective_state_update(state, inp.u, inp.delta, inp.A, inp.B, inp.C, inp.D,
                                      inp.z, inp.delta_bias, dt_softplus=True)  # [S, d_inner]

    return run_stateful(cache, batch, span, decode)


class Mamba2Inputs(NamedTuple):
    """SSD inputs: x [T, nheads, headdim]; dt [T, nheads]; A, dt_bias [nheads]; B, C
    [T, ngroups, d_state]; D [nheads]; dt = clamp(softplus(dt + dt_bias), *dt_limit)."""

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    dt_bias: torch.Tensor | None
    chunk_size: int
    dt_limit: tuple[float, float]


def mamba2_scan(inp: Mamba2Inputs, cache: torch.Tensor, batch: MambaBatch) -> torch.Tensor:
    """Mamba-2 SSD scan over the step (no gate); cache [num_blocks, nheads, headdim, d_state].

    The decode update clamps dt with `dt_limit` like the chunked scan does, so
    a token's output does not depend on how the sequence was cut into steps.
    Returns [T, nheads, headdim].
    """
    def span(rows: slice, start: torch.Tensor, offsets: list[int]) -> SpanOutput:
        res = mamba_chunk_scan_combined(
            inp.x[None, rows], inp.dt[None, rows], inp.A, inp.B[None, rows], inp.C[None, rows],
            inp.chunk_size, D=inp.D, dt_bias=inp.dt_bias, initial_states=start,
            dt_softplus=True, dt_limit=inp.dt_limit, emit_positions=offsets)
        return res._replace(out=res.out[0])  # [L, nheads, headdim]

    def decode(state: torch.Tensor) -> torch.Tensor:
        return ssd_state_update(state, inp.x, inp.dt, inp.A, inp.B, inp.C, inp.D, None,
                                inp.dt_bias, dt_softplus=True, dt_limit=inp.dt_limit)

    return run_stateful(cache, batch, span, decode)


# ------------------------------------------------------------------------- runner base
class HybridStep(NamedTuple):
    """What one step gives every layer."""

    step: Step
    attn_batches: Mapping[str, AttentionBatch]
    mamba_batches: Mapping[str, MambaBatch]


# activations the causal conv of a Mamba mixer takes
CONV_ACTIVATIONS = ("silu", "swish")


class HybridRunner(ModelRunner):
    """Runner base for decoders of attention, Mamba and cache-free feed-forward layers.

    Subclasses give `layer_kinds` (one of ATTENTION, MAMBA, FFN per decoder
    layer), `build_mamba_layer`, `embed`, `final_norm` and `hybrid_layer`.
    `kinds` holds those kinds; `attn_layers` lists the attention layers only
    (`"layers.{i}.attn"`); `mamba_layers` maps decoder index -> `MambaLayer`
    (`"layers.{i}.mamba"`).
    Attention layers have no positional encoding unless a subclass adds one.
    """

    @abstractmethod
    def layer_kinds(self) -> list[str]:
        """ATTENTION, MAMBA or FFN for each decoder layer."""

    def block_kinds(self, kinds: Mapping[str, str], conv_act_field: str) -> list[str]:
        """`layer_kinds` from `config.layers_block_type` mapped by `kinds`; ValueError
        naming an unsupported block type or Mamba conv activation (`conv_act_field`)."""
        family = self.model_type
        block_types = list(self.config.layers_block_type)
        unknown = sorted(set(block_types) - set(kinds))
        if unknown:
            raise ValueError(f"{family}: layer types {unknown} are not supported")
        act = getattr(self.config, conv_act_field)
        if act not in CONV_ACTIVATIONS:
            raise ValueError(f"{family}: {conv_act_field} {act!r} is not supported in the Mamba "
                             f"conv; supported: {CONV_ACTIVATIONS}")
        return [kinds[block_type] for block_type in block_types]

    @abstractmethod
    def build_mamba_layer(self, index: int) -> MambaLayer:
        """The state shapes of decoder layer `index` (a Mamba layer)."""

    @abstractmethod
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, hidden]."""

    @abstractmethod
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The norm before the LM head, on [S, hidden]."""

    @abstractmethod
    def hybrid_layer(self, index: int, layer: nn.Module, hidden: torch.Tensor,
                     ctx: HybridStep) -> torch.Tensor:
        """Decoder layer `index` on hidden [T, hidden]."""

    # ----------------------------------------------------------------- layout
    def build_attention_layers(self) -> list[AttentionLayer]:
        self.kinds = self.layer_kinds()
        if len(self.kinds) != len(self.decoder.layers):
            raise ValueError(f"{self.model_type}: {len(self.kinds)} layer kinds for "
                             f"{len(self.decoder.layers)} decoder layers")
        num_heads, num_kv_heads, head_dim = self.head_dims()
        self.attn_index: dict[int, int] = {}
        self.mamba_layers: dict[int, MambaLayer] = {}
        layers = []
        for index, kind in enumerate(self.kinds):
            if kind == ATTENTION:
                self.attn_index[index] = len(layers)
                layers.append(AttentionLayer(
                    name=f"layers.{index}.attn", num_heads=num_heads, num_kv_heads=num_kv_heads,
                    head_dim=head_dim, scale=head_dim ** -0.5, rope_key=None))
            elif kind == MAMBA:
                self.mamba_layers[index] = self.build_mamba_layer(index)
            elif kind != FFN:
                raise ValueError(f"{self.model_type}: unknown layer kind {kind!r}")
        self.mamba_caches: dict[str, tuple[torch.Tensor, ...]] = {}
        return layers

    def kv_cache_specs(self, block_size: int) -> dict[str, KVCacheSpec]:
        """Layer name -> spec in layer order, e.g. {"layers.0.mamba": MambaSpec(...),
        "layers.1.attn": FullAttentionSpec(...), ...}."""
        attn = super().kv_cache_specs(block_size)
        specs: dict[str, KVCacheSpec] = {}
        for index, kind in enumerate(self.kinds):
            if kind == ATTENTION:
                name = self.attn_layers[self.attn_index[index]].name
                specs[name] = attn[name]
            elif kind == MAMBA:
                layer = self.mamba_layers[index]
                specs[layer.name] = layer.kv_cache_spec(block_size)
        return specs

    def bind_kv_cache(self, kv_caches: Mapping[str, tuple[torch.Tensor, ...]]) -> None:
        """Use these tensors: (k, v) per attention layer, (conv, ssm) state views
        `[num_blocks, *shape]` per Mamba layer. ValueError for a missing layer or bad shape."""
        for layer in self.mamba_layers.values():
            views = kv_caches.get(layer.name)
            if views is None:
                raise ValueError(f"bind_kv_cache: no cache for layer {layer.name!r}")
            shapes = (layer.conv_shape, layer.ssm_shape)
            if len(views) != 2 or any(v.dim() != len(s) + 1 or tuple(v.shape[1:]) != s
                                      for v, s in zip(views, shapes)):
                raise ValueError(f"bind_kv_cache: {layer.name} needs views [num_blocks, *shape] "
                                 f"for shapes {shapes}, got "
                                 f"{[tuple(v.shape) for v in views]}")
        super().bind_kv_cache(kv_caches)
        self.mamba_caches = {layer.name: tuple(kv_caches[layer.name])
                             for layer in self.mamba_layers.values()}

    # ---------------------------------------------------------------- forward
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn_batches: Mapping[str, AttentionBatch], logits_indices: torch.Tensor,
                mamba_batches: Mapping[str, MambaBatch] | None = None) -> torch.Tensor:
        """Run one step; float32 logits [S, vocab] of the rows `logits_indices`.

        Attention K/V of the new tokens go to the bound caches; Mamba states
        are read and written as `mamba_batches` (layer name -> MambaBatch) say.
        Raises ValueError for missing batches or an inconsistent MambaBatch.
        """
        mamba_batches = mamba_batches or {}
        self._check_hybrid_step(input_ids, positions, attn_batches, mamba_batches)
        step = Step(positions, {key: rotary.cos_sin(positions)
                                for key, rotary in self.rotaries.items()})
        ctx = HybridStep(step, attn_batches, mamba_batches)
        hidden = self.embed(input_ids)  # [T, hidden]
        for index, layer in enumerate(self.decoder.layers):
            hidden = self.hybrid_layer(index, layer, hidden, ctx)
        return self.compute_logits(self.final_norm(hidden[logits_indices]))

    def attend(self, index: int, attn: nn.Module, x: torch.Tensor,
               ctx: HybridStep) -> torch.Tensor:
        """Attention of decoder layer `index` on x [T, hidden] over its paged cache."""
        slot = self.attn_index[index]
        batch = ctx.attn_batches[self.attn_layers[slot].name]
        return self.self_attention(slot, attn, x, ctx.step, batch)

    def mamba_views(self, index: int, ctx: HybridStep) -> tuple[torch.Tensor, torch.Tensor,
                                                               MambaBatch]:
        """(conv cache, ssm cache, batch) of Mamba layer `index`."""
        name = self.mamba_layers[index].name
        conv_cache, ssm_cache = self.mamba_caches[name]
        return conv_cache, ssm_cache, ctx.mamba_batches[name]

    def _check_hybrid_step(self, input_ids: torch.Tensor, positions: torch.Tensor,
                           attn_batches: Mapping[str, AttentionBatch],
                           mamba_batches: Mapping[str, MambaBatch]) -> None:
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(f"input_ids and positions must be 1-D of one length, got "
                             f"{tuple(input_ids.shape)} and {tuple(positions.shape)}")
        if len(self.mamba_caches) != len(self.mamba_layers) or (
                self.attn_layers and not self.kv_caches):
            raise ValueError("forward before bind_kv_cache")
        missing = [layer.name for layer in self.attn_layers if layer.name not in attn_batches]
        missing += [layer.name for layer in self.mamba_layers.values()
                    if layer.name not in mamba_batches]
        if missing:
            raise ValueError(f"no batch for layers {missing}")
        checked: set[int] = set()
        for layer in self.mamba_layers.values():
            batch = mamba_batches[layer.name]
            if id(batch) not in checked:
                check_mamba_batch(batch, input_ids.shape[0])
                checked.add(id(batch))


def check_mamba_batch(batch: MambaBatch, num_tokens: int) -> None:
    """ValueError unless `batch` describes `num_tokens` rows consistently.

    Every sequence has at least one token; checkpoint offsets k are strictly
    increasing within [0, n_s].
    """
    starts = list(batch.query_start_loc)
    num_seqs = batch.num_seqs
    if len(starts) != num_seqs + 1 or starts[0] != 0 or starts[-1] != num_tokens:
        raise ValueError(f"MambaBatch.query_start_loc {starts} does not split {num_tokens} "
                         f"tokens into {num_seqs} sequences")
    lists = (batch.source_blocks, batch.has_initial_state, batch.checkpoints)
    if any(len(values) != num_seqs for values in lists):
        raise ValueError(f"MambaBatch lists must all have {num_seqs} entries")
    for s in range(num_seqs):
        length = starts[s + 1] - starts[s]
        offsets = [k for k, _ in batch.checkpoints[s]]
        if length < 1:
            raise ValueError(f"MambaBatch sequence {s} has {length} tokens; at least 1 needed")
        if any(not 0 <= k <= length for k in offsets) or offsets != sorted(set(offsets)):
            raise ValueError(f"MambaBatch sequence {s}: checkpoint offsets {offsets} must be "
                             f"strictly increasing within [0, {length}]")
