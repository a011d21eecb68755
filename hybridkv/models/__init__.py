"""Model runners: Hugging Face decoders run over a paged KV cache."""

from hybridkv.models.base import AttentionLayer, ModelRunner
from hybridkv.models.gemma import Gemma2Runner, Gemma3Runner
from hybridkv.models.gpt_oss import GptOssRunner
from hybridkv.models.llama4 import Llama4Runner
from hybridkv.models.presets import Preset, build_preset_model, get_preset, list_presets
from hybridkv.models.qwen2 import MistralRunner, Qwen2Runner
from hybridkv.models.registry import (
    RUNNERS,
    get_runner_class,
    load_model,
    register_runner,
    supported_model_types,
)
from hybridkv.models.rope import RotaryEmbedding, rotary_from_params

__all__ = [
    "RUNNERS",
    "AttentionLayer",
    "Gemma2Runner",
    "Gemma3Runner",
    "GptOssRunner",
    "Llama4Runner",
    "MistralRunner",
    "ModelRunner",
    "Preset",
    "Qwen2Runner",
    "RotaryEmbedding",
    "build_preset_model",
    "get_preset",
    "get_runner_class",
    "list_presets",
    "load_model",
    "register_runner",
    "rotary_from_params",
    "supported_model_types",
]
