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
"""

from __future__ import annotations

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
    if not isinstance(module, nn.Linear) or not torch.backends.mkldnn.is_available():
        return False
    weight = module.weight
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and weight.numel() >= MIN_WEIGHT_ELEMENTS
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinears:
    """Packed weights of chosen `nn.Linear` modules; `apply(module, x)` runs either path.

    Example: `linears.add(layer.mlp.up_proj)`, then `linears.apply(layer.mlp.up_proj, x)`
    with x `[8, hidden]` uses the packed copy, with x `[512, hidden]` the module itself.
    """

    def __init__(self) -> None:
        # id(module) -> (module, packed weight); the module is kept so its id stays unique
        self._packed: dict[int, tuple[nn.Linear, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._packed)

    def add(self, module: nn.Module) -> bool:
        """Pack `module`'s weight if `can_prepack` allows; returns whether it did."""
        if id(module) in self._packed or not can_prepack(module):
            return False
        assert isinstance(module, nn.Linear)
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), BATCH_HINT)
        self._packed[id(module)] = (module, packed)
        return True

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
