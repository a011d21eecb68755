"""A digest naming a model: its config and every weight.

Two models that differ in any weight (another checkpoint, another random
seed, a fine-tune) get different digests, so their KV blocks never meet in a
shared store. Reading every weight costs one pass over the parameters
(XXH3-128, about 0.1-0.5 s per GB here), once per engine.
"""

from __future__ import annotations

import json

import torch
import xxhash
from torch import nn

# config entries that name where a model came from, not what it computes
_IGNORED_CONFIG_KEYS = ("_name_or_path", "transformers_version", "_commit_hash")


def model_digest(model: nn.Module) -> bytes:
    """16 bytes: XXH3-128 of the model's config (as sorted JSON) and of every
    tensor in its state dict (name, dtype, shape, bytes)."""
    h = xxhash.xxh3_128()
    config = getattr(model, "config", None)
    if config is not None:
        entries = {k: v for k, v in config.to_dict().items() if k not in _IGNORED_CONFIG_KEYS}
        h.update(json.dumps(entries, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        if t.numel():
            data = t.to("cpu").contiguous().reshape(-1).view(torch.uint8)
            h.update(memoryview(data.numpy()))
    return h.digest()
