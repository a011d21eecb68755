"""Layer layouts of real models, without their weights, for capacity planning.

A layout is what the KV cache sees of a model: one spec per attention or
Mamba layer. It comes from the same runner code the engine uses, applied to a
model built on PyTorch's meta device (shapes only, no memory), so a 100B
model's layout costs a fraction of a second.

`KNOWN_MODELS` describes well-known checkpoints from their published
configs; `layout_from_config_file` reads any supported `config.json`. A
multimodal config (Gemma 3 4B+, Llama 4) gives the layout of its
`text_config`, the part the engine serves.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hybridkv.kv_cache.specs import KVCacheSpec
from hybridkv.models.registry import MULTIMODAL, get_runner_class, supported_model_types

# model_type and the config values that shape the KV cache, from the published configs
KNOWN_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma-3-27b": ("gemma3_text", {
        "num_hidden_layers": 62, "hidden_size": 5376, "intermediate_size": 21504,
        "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
        "sliding_window": 1024, "query_pre_attn_scalar": 168, "vocab_size": 262208,
        "max_position_embeddings": 131072, "dtype": "bfloat16"}),
    "gpt-oss-120b": ("gpt_oss", {
        "num_hidden_layers": 36, "hidden_size": 2880, "intermediate_size": 2880,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "sliding_window": 128, "num_local_experts": 128, "num_experts_per_tok": 4,
        "vocab_size": 201088, "max_position_embeddings": 131072, "dtype": "bfloat16"}),
    "jamba-1.5-mini": ("jamba", {
        "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_period": 8,
        "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1,
        "num_experts": 16, "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
        "mamba_expand": 2, "vocab_size": 65536, "max_position_embeddings": 262144,
        "dtype": "bfloat16"}),
    "llama-4-scout": ("llama4_text", {
        "num_hidden_layers": 48, "hidden_size": 5120, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "num_attention_heads": 40, "num_key_value_heads": 8,
        "head_dim": 128, "attention_chunk_size": 8192, "no_rope_layer_interval": 4,
        "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
        "vocab_size": 202048, "max_position_embeddings": 10485760, "dtype": "bfloat16"}),
}


def layout_from_hf_config(config: Any, block_size: int) -> dict[str, KVCacheSpec]:
    """Per-layer KV cache specs of the model `config` describes (no weights)."""
    if config.model_type not in supported_model_types():
        raise ValueError(f"model_type {config.model_type!r} is not supported; use one of "
                         f"{sorted(supported_model_types())}")
    if config.model_type in MULTIMODAL:
        config = config.get_text_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if isinstance(dtype, torch.dtype):
        model = model.to(dtype)
    return get_runner_class(config.model_type).from_hf(model).kv_cache_specs(block_size)


def known_model_layout(name: str, block_size: int) -> dict[str, KVCacheSpec]:
    """The layout of a model in `KNOWN_MODELS`; ValueError listing them otherwise."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))} "
                         f"(or pass a config.json path)")
    model_type, values = KNOWN_MODELS[name]
    return layout_from_hf_config(AutoConfig.for_model(model_type, **values), block_size)


def layout_from_config_file(path: str | os.PathLike, block_size: int) -> dict[str, KVCacheSpec]:
    """The layout of the model a Hugging Face `config.json` (or its folder) describes."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config file at {path!r}")
    try:
        with open(path) as f:
            values = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON config ({e})") from e
    if not isinstance(values, dict) or "model_type" not in values:
        raise ValueError(f"{path}: a config must be a JSON object with a model_type")
    model_type = values.pop("model_type")
    if model_type not in supported_model_types():
        raise ValueError(f"{path}: model_type {model_type!r} is not supported; use one of "
                         f"{sorted(supported_model_types())}")
    return layout_from_hf_config(AutoConfig.for_model(model_type, **values), block_size)


def model_layout(model: str, block_size: int) -> dict[str, KVCacheSpec]:
    """A known model name, a config.json path, or a folder holding one."""
    if model in KNOWN_MODELS:
        return known_model_layout(model, block_size)
    if os.path.exists(model):
        return layout_from_config_file(model, block_size)
    raise ValueError(f"unknown model {model!r}: not a known model "
                     f"({', '.join(sorted(KNOWN_MODELS))}) nor a config.json path")
