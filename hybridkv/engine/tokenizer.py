"""Which tokenizer an LLM uses: the preset's, the checkpoint's, or the one given.

    load_tokenizer("gemma3-tiny")               # the preset's built-in tokenizer
    load_tokenizer("/ckpt")                     # /ckpt's own tokenizer files, or None
    load_tokenizer(hf_model)                    # None: a model object carries none
    load_tokenizer(hf_model, "/tok")            # the tokenizer saved in /tok
    load_tokenizer(hf_model, tokenizer_object)  # that object
"""

from __future__ import annotations

import os
from typing import Any

from transformers import PreTrainedTokenizerBase

from hybridkv.models.presets import PRESETS
from hybridkv.models.tokenizers import load_preset_tokenizer


def load_tokenizer(model: Any, tokenizer: Any = None) -> PreTrainedTokenizerBase | None:
    """The tokenizer for `model` (what `LLM` takes), or `tokenizer` when given.

    `tokenizer`: None, a `transformers` tokenizer, or a directory of saved
    tokenizer files (read offline; FileNotFoundError when it is no directory,
    ValueError when it holds no readable tokenizer). Without it: a preset's
    built-in tokenizer, a checkpoint directory's own tokenizer files (None
    when it has none) and None for a model object.
    """
    if tokenizer is not None:
        return _given_tokenizer(tokenizer)
    if isinstance(model, str) and model in PRESETS:
        return load_preset_tokenizer(model)
    if isinstance(model, str | os.PathLike) and os.path.isdir(model):
        try:
            return _read_directory(model)
        except (OSError, ValueError):
            return None
    return None


def _given_tokenizer(tokenizer: Any) -> PreTrainedTokenizerBase:
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    if not isinstance(tokenizer, str | os.PathLike):
        raise ValueError(f"tokenizer must be a transformers tokenizer or a directory, got "
                         f"{type(tokenizer).__name__}")
    if not os.path.isdir(tokenizer):
        raise FileNotFoundError(f"tokenizer directory {str(tokenizer)!r} does not exist")
    try:
        return _read_directory(tokenizer)
    except (OSError, ValueError) as error:
        raise ValueError(f"no readable tokenizer in {str(tokenizer)!r}: {error}") from error


def _read_directory(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
