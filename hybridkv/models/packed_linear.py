"""Linear layers with oneDNN-prepacked weights, for decode-sized steps on CPU.

A decode step multiplies a few rows (one per sequence) by every weight matrix of the
model, so on CPU it is bound by how fast the weights stream from memory. torch's
`F.linear` hands the `[out, in]` weight to the BLAS as a transposed operand on every
call; oneDNN can instead keep a copy of the weight in its own blocked layout, made
once, which its small-batch kernels read faster (measured on the Gemma 3 270M shape,
8 rows, one thread: about 1.4x for the matrix products of a step; see
benchmarks/RESULTS.md). Prefill-sized products gain too: on an AVX-512 CPU without AMX,
oneDNN's kernels for the packed layout run at 108-111 GFLOP/s on one thread where
`F.linear` runs at 90-100 (82 to 2,048 rows of the 270M shape's projections). vLLM's CPU
backend packs its linear weights for oneDNN, at every batch size.

The packed copies are held beside the model's own weights (the model is shared with
its owner and stays untouched), so they cost a second copy of every packed matrix.
Steps of at least `MIN_ROWS` rows use them (a single row is as fast unpacked). Only
weights of at least `MIN_WEIGHT_ELEMENTS` are packed: for smaller ones
oneDNN's per-call cost exceeds what the layout saves (measured, 8 rows: a 64 x 128 weight
0.55x, 256 x 256 1.36x). The copies are taken once: weights changed afterwards are not seen.

Projections that read the same input (q, k and v; gate and up) can be packed stacked into
one matrix (`add_fused`), so a step runs one product per group, as vLLM's fused layers do;
each output is then a column slice of that product.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

import torch
from torch import nn

MIN_ROWS = 2
# Rows the packed layout is tuned for (oneDNN's batch-size hint); a decode batch of 8
# measured as fast as larger hints at 2 to 2,048 rows.
BATCH_HINT = 8
MIN_WEIGHT_ELEMENTS = 1 << 16


def can_prepack(module: nn.Module) -> bool:
    """Whether `module` is an `nn.Linear` whose weight oneDNN can pack here (float32, CPU)
    and is large enough to gain from it."""
    return _packable(module) and module.weight.numel() >= MIN_WEIGHT_ELEMENTS


def _packable(module: nn.Module | None) -> TypeGuard[nn.Linear]:
    """Whether oneDNN can pack `module`'s weight here (an `nn.Linear`, float32, CPU)."""
    if not isinstance(module, nn.Linear) or not torch.backends.mkldnn.is_available():
        return False
    weight = module.weight
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinears:
    """Packed weights of chosen `nn.Linear` modules; `apply(module, x)` runs either path.

    Example: `linears.add(layer.mlp.up_proj)`, then `linears.apply(layer.mlp.up_proj, x)`
    with x `[8, hidden]` uses the packed copy, with x `[512, hidden]` the module itself.
    """

    def __init__(self) -> None:
        # id(module) -> (module, packed weight); the module is kept so its id stays unique
        self._packed: dict[int, tuple[nn.Linear, torch.Tensor]] = {}
        # ids of modules fed the same input -> (their output widths, packed stacked weight,
        # stacked bias or None); see `add_fused`
        self._fused: dict[tuple[int, ...], tuple[list[int], torch.Tensor,
                                                   torch.Tensor | None]] = {}
        self._fused_modules: list[nn.Linear] = []  # keeps the fused modules' ids unique

    def __len__(self) -> int:
        return len(self._packed) + sum(len(key) for key in self._fused)

    def add(self, module: nn.Module) -> bool:
        """Pack `module`'s weight if `can_prepack` allows; returns whether it did."""
        if id(module) in self._packed or not can_prepack(module):
            return False
        assert isinstance(module, nn.Linear)
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), BATCH_HINT)
        self._packed[id(module)] = (module, packed)
        return True

    def add_fused(self, modules: Sequence[nn.Module | None]) -> bool:
        """Pack the weights of `modules` (linears applied to one input, e.g. q, k and v)
        stacked into one matrix, so `apply_all` runs them as one product; returns whether
        it did. Refused (nothing packed) when one of them cannot be packed, or only some
        carry a bias, or their input widths differ, or the stacked matrix is smaller than
        `MIN_WEIGHT_ELEMENTS`."""
        linears = [m for m in modules if _packable(m)]
        if len(linears) < 2 or len(linears) != len(modules):
            return False
        biases = [m.bias for m in linears]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            return False
        if len({m.in_features for m in linears}) != 1 or \
                sum(m.weight.numel() for m in linears) < MIN_WEIGHT_ELEMENTS:
            return False
        key = tuple(id(m) for m in linears)
        if key in self._fused:
            return False
        with torch.no_grad():
            stacked = torch.cat([m.weight.detach() for m in linears])  # [sum(out), in]
            packed = torch.ops.mkldnn._reorder_linear_weight(stacked, BATCH_HINT)
            bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        self._fused[key] = ([m.out_features for m in linears], packed, bias)
        self._fused_modules.extend(linears)
        return True

    def is_fused(self, modules: Sequence[nn.Module | None]) -> bool:
        """Whether `add_fused` packed exactly these modules together."""
        return tuple(id(m) for m in modules) in self._fused

    def apply_all(self, modules: Sequence[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
        """`[m(x) for m in modules]` for x `[rows, in]`; one packed product split by
        column when `add_fused` packed these modules together and `rows >= MIN_ROWS`
        (each output `[rows, out_i]` is then a view of the product `[rows, sum(out)]`)."""
        entry = self._fused.get(tuple(id(m) for m in modules))
        if entry is None or x.dim() != 2 or x.shape[0] < MIN_ROWS:
            return [self.apply(m, x) for m in modules]
        widths, packed, bias = entry
        if x.dtype != packed.dtype or not x.is_contiguous():
            x = x.to(packed.dtype).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        return list(out.split(widths, dim=1))

    def apply(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """`module(x)` for x `[rows, in]`, through the packed weight when it has one and
        `rows >= MIN_ROWS`."""
        entry = self._packed.get(id(module))
        if entry is None or x.dim() != 2 or x.shape[0] < MIN_ROWS:
            return module(x)
        linear, packed = entry
        if x.dtype != packed.dtype or not x.is_contiguous():
            x = x.to(packed.dtype).contiguous()
        return torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")


def gated_mlp_parts(mlp: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module] | None:
    """(gate_proj, up_proj, down_proj) of a gated MLP whose forward is
    `down(act(gate(x)) * up(x))` (the Llama / Gemma / Qwen2 MLP), else None."""
    names = ("gate_proj", "up_proj", "down_proj")
    if not type(mlp).__name__.endswith("MLP") or not hasattr(mlp, "act_fn"):
        return None
    parts = tuple(getattr(mlp, name, None) for name in names)
    if not all(isinstance(part, nn.Linear) for part in parts):
        return None
    return parts  # type: ignore[return-value]
