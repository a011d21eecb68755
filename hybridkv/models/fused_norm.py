"""RMSNorms as one `torch.rms_norm` call, for the norm classes whose arithmetic it matches.

A Gemma 3 decoder layer runs six RMSNorms (four around attention and MLP, one on each
query and key head); Hugging Face's modules write each as five or six small tensor
operations (square, mean, add, rsqrt, two products), so a decode step of the 18-layer
270M shape spends about a hundred norms' worth of operator calls on rows of a few
kilobytes. `torch.rms_norm` does the same arithmetic in one call (measured on [8, 640]
float32, one thread: 13-32 us against 25-40 us per norm, outputs equal on the inputs
tried; from about 600 rows on the two cost the same).

Where the C kernel `_norm_rope` is built, a norm is one pass over its rows, and a residual
add joins the norms around it (`residual`: `h + post(x)`, then `pre` of that sum), so a
Gemma layer's four norms and two adds are two calls (`hybridkv.kernels.norm_rope`).

Only classes known to compute `norm(x) * (offset + weight)` in float32 are taken
(`NORM_OFFSETS`), and only for float32 inputs, where Hugging Face's casts are no-ops.
The effective weight `offset + weight` is taken once, when the module is added: like the
packed linear weights, weights changed afterwards are not seen.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.kernels.norm_rope import NormWeight, residual_norm, rms_norm

# class name -> offset added to the weight: Gemma scales by (1 + w), Llama and Qwen2 by w
NORM_OFFSETS = {"Gemma2RMSNorm": 1.0, "Gemma3RMSNorm": 1.0,
                "LlamaRMSNorm": 0.0, "Qwen2RMSNorm": 0.0}


def norm_eps(module: nn.Module) -> float | None:
    """The epsilon of a supported float32 RMSNorm module, else None."""
    offset = NORM_OFFSETS.get(type(module).__name__)
    weight = getattr(module, "weight", None)
    if offset is None or not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return None
    if weight.dtype != torch.float32:
        return None
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    return float(eps) if isinstance(eps, int | float) else None


class FusedNorms:
    """Supported RMSNorm modules, run as `torch.rms_norm`; `apply(module, x)` runs either.

    Example: `norms.add(layer.input_layernorm)`, then
    `norms.apply(layer.input_layernorm, x)` with x `[8, 640]` float32 is one call.
    """

    def __init__(self) -> None:
        # id(module) -> (module, eps, effective weight [D]); the module keeps its id unique
        self._norms: dict[int, tuple[nn.Module, float, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._norms)

    def add(self, module: nn.Module) -> bool:
        """Take `module` when `norm_eps` knows it; returns whether it did."""
        eps = norm_eps(module)
        if eps is None or id(module) in self._norms:
            return False
        offset = NORM_OFFSETS[type(module).__name__]
        with torch.no_grad():
            weight = module.weight.detach().float() + offset  # type: ignore[operator]
        self._norms[id(module)] = (module, eps, weight)
        return True

    def add_all(self, model: nn.Module) -> int:
        """Take every supported norm inside `model`; returns how many were taken."""
        return sum(self.add(module) for module in model.modules())

    def weight(self, module: nn.Module | None, x: torch.Tensor) -> NormWeight | None:
        """(effective weight, eps) of `module` when it was added and applies to x (float32
        on the weight's device, last dimension the weight's size), else None."""
        entry = self._norms.get(id(module))
        if entry is None or x.dtype != torch.float32:
            return None
        _, eps, weight = entry
        if x.device != weight.device or x.shape[-1] != weight.shape[0]:
            return None
        return weight, eps

    def apply(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """`module(x)` over the last dimension of x; one kernel call when `module` was added
        and x is float32 on the weight's device."""
        norm = self.weight(module, x)
        return module(x) if norm is None else rms_norm(x, norm)

    def residual(self, hidden: torch.Tensor, x: torch.Tensor, post: nn.Module | None,
                 pre: nn.Module | None, *, in_place: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(`h = hidden + post(x)`, `pre(h)`) for hidden and x `[T, D]`; None for `post`
        adds x itself, None for `pre` returns None beside h. One kernel call when every
        given norm was added; `in_place`: h may be written over `hidden` (the caller's)."""
        post_weight = None if post is None else self.weight(post, x)
        pre_weight = None if pre is None else self.weight(pre, x)
        if (post is None or post_weight is not None) and (pre is None or pre_weight is not None):
            return residual_norm(hidden, x, post_weight, pre_weight, in_place=in_place)
        hidden = hidden + (x if post is None else self.apply(post, x))
        return hidden, None if pre is None else self.apply(pre, hidden)
