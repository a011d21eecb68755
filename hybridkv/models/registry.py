"""From a Hugging Face `model_type` to its runner class, and `load_model`.

The registry is open: another family joins with
`register_runner("jamba", JambaRunner)`.

`load_model` accepts a built-in preset name, a local checkpoint directory or
a `transformers` model instance, and returns the matching runner:

    runner = load_model("gemma3-tiny", seed=0)
    runner.kv_cache_specs(16)["layers.0.attn"]   # SlidingWindowSpec(..., sliding_window=32)

Multimodal checkpoints (`MULTIMODAL`: Gemma 3 4B and larger, `model_type`
"gemma3"; Llama 4 Scout / Maverick, "llama4") are served text-only: the
runner of the text model type gets a causal LM sharing the checkpoint's
language model and LM head; the vision tower is not used.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, PreTrainedModel

from hybridkv.models.base import ModelRunner
from hybridkv.models.gemma import Gemma2Runner, Gemma3Runner
from hybridkv.models.gpt_oss import GptOssRunner
from hybridkv.models.jamba import JambaRunner
from hybridkv.models.llama4 import Llama4Runner
from hybridkv.models.nemotron_h import NemotronHRunner
from hybridkv.models.presets import PRESETS, build_preset_model, get_preset
from hybridkv.models.qwen2 import MistralRunner, Qwen2Runner

RUNNERS: dict[str, type[ModelRunner]] = {
    runner.model_type: runner
    for runner in (Gemma2Runner, Gemma3Runner, Qwen2Runner, MistralRunner, Llama4Runner,
                   GptOssRunner, JambaRunner, NemotronHRunner)
}




@dataclass(frozen=True)
class MultimodalParts:
    """Where a multimodal model keeps its language model, as `get_submodule` paths."""

    text_model_type: str
    decoder: str  # the text decoder (embeddings, layers, final norm)
    lm_head: str
    caps_logits: bool  # whether the multimodal model applies final_logit_softcapping


MULTIMODAL: dict[str, MultimodalParts] = {
    # Gemma3ForConditionalGeneration: model.language_model is a Gemma3TextModel; its
    # forward is lm_head(hidden) with no final logit softcapping
    "gemma3": MultimodalParts("gemma3_text", "model.language_model", "lm_head", False),
    # Llama4ForConditionalGeneration: language_model is a whole Llama4ForCausalLM
    "llama4": MultimodalParts("llama4_text", "language_model.model", "language_model.lm_head",
                              True),
}


def register_runner(model_type: str, runner_cls: type[ModelRunner]) -> None:
    """Run models of `model_type` with `runner_cls` (replaces an earlier entry)."""
    if not isinstance(runner_cls, type) or not issubclass(runner_cls, ModelRunner):
        raise ValueError(f"register_runner: {runner_cls!r} is not a ModelRunner subclass")
    RUNNERS[model_type] = runner_cls


def supported_model_types() -> list[str]:
    """The model types a runner exists for (multimodal ones included), sorted."""
    return sorted(set(RUNNERS) | set(MULTIMODAL))


def get_runner_class(model_type: str) -> type[ModelRunner]:
    """The runner class of `model_type` (of its language model for a multimodal
    type); ValueError listing the supported ones otherwise."""
    if model_type in MULTIMODAL:
        model_type = MULTIMODAL[model_type].text_model_type
    if model_type not in RUNNERS:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: "
                         f"{', '.join(supported_model_types())}")
    return RUNNERS[model_type]


def load_model(model: str | os.PathLike | PreTrainedModel, *, dtype: torch.dtype | None = None,
               seed: int = 0) -> ModelRunner:
    """A runner for a preset name, a local checkpoint directory or a model instance.

    - a preset name (see `list_presets`): the tiny model built with
      `torch.manual_seed(seed)`, its `max_model_len` the preset's;
    - a directory: `AutoModelForCausalLM.from_pretrained(dir, local_files_only=True)`
      (`AutoModelForImageTextToText` for a multimodal `model_type`);
      FileNotFoundError when the directory, its config.json or its weights are
      missing, ValueError when config.json is unreadable or the weights corrupt;
    - a `PreTrainedModel`: wrapped, sharing its weights.
    `dtype` casts the weights. ValueError for an unsupported model_type. Always eval mode.
    """
    if isinstance(model, PreTrainedModel):
        hf_model = model if dtype is None else model.to(dtype)
        return _wrap(hf_model)
    if isinstance(model, str) and model in PRESETS:
        runner = _wrap(build_preset_model(model, seed=seed, dtype=dtype))
        runner.max_model_len = get_preset(model).max_model_len
        return runner
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(f"load_model: expected a preset name, a directory or a "
                         f"PreTrainedModel, got {type(model).__name__}")
    return _load_directory(Path(model), dtype)


def _wrap(model: PreTrainedModel) -> ModelRunner:
    if model.config.model_type in MULTIMODAL:
        model = language_model(model)
    runner_cls = get_runner_class(model.config.model_type)
    return runner_cls.from_hf(model.eval())


def language_model(model: PreTrainedModel) -> PreTrainedModel:
    """The text-only causal LM of a multimodal `model`, sharing its weights.

    A causal LM of the text config (e.g. `Gemma3ForCausalLM`) is built on the
    meta device and given the model's own decoder and LM head, and its
    generation config (so the same end-of-sequence ids apply). Its logits are
    those of the multimodal model on a text-only prompt.
    """
    parts = MULTIMODAL[model.config.model_type]
    config = copy.deepcopy(model.config.get_text_config())
    if not parts.caps_logits:
        config.final_logit_softcapping = None
    with torch.device("meta"):
        text = AutoModelForCausalLM.from_config(config)
    text.model = model.get_submodule(parts.decoder)
    text.lm_head = model.get_submodule(parts.lm_head)
    text.generation_config = model.generation_config
    return text.eval()


def _load_directory(path: Path, dtype: torch.dtype | None) -> ModelRunner:
    model_type = read_model_type(path)
    get_runner_class(model_type)  # refuse before reading any weights
    kwargs = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    auto = AutoModelForImageTextToText if model_type in MULTIMODAL else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(str(path), **kwargs)
    except OSError as error:  # no weights file, or an unreadable one
        raise FileNotFoundError(f"load_model: cannot load weights from {str(path)!r}: "
                                f"{error}") from error
    except Exception as error:  # corrupt weights: bad headers, wrong shapes
        raise ValueError(f"load_model: corrupt checkpoint in {str(path)!r}: {error}") from error
    return _wrap(model)


def read_model_type(path: str | os.PathLike) -> str:
    """`model_type` from `path`/config.json.

    FileNotFoundError: `path` is not a directory (and not a preset name) or has no
    config.json. ValueError: config.json is not a JSON object with a model_type.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"load_model: {str(path)!r} is neither a preset "
                                f"({', '.join(PRESETS)}) nor a directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"load_model: no config.json in {str(path)!r}")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"load_model: cannot read {str(config_file)!r}: {error}") from error
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError(f"load_model: {str(config_file)!r} has no model_type")
    return config["model_type"]
