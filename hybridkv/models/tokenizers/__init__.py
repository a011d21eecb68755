"""Small real tokenizers with chat templates for the built-in presets.

Every preset has a byte-level BPE tokenizer trained on a corpus shipped in
the package (files in `data/`, rebuilt by `python -m
hybridkv.models.tokenizers.build`) and its family's chat template, so text
prompts and chat work offline:

    tok = load_preset_tokenizer("gemma3-tiny")
    tok.encode("Hello")                              # [1, ...]: <bos> first
    tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                            add_generation_prompt=True)
    # '<bos><start_of_turn>user\\nHi<end_of_turn>\\n<start_of_turn>model\\n'

Ids 0, 1, 2 are the pad, bos and eos tokens, as in every preset's config;
all ids are below the preset's `vocab_size`.
"""

from __future__ import annotations

from importlib import resources

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from hybridkv.models.presets import get_preset
from hybridkv.models.tokenizers.families import FAMILIES, PRESET_TO_FAMILY, TokenizerFamily


def preset_tokenizer_family(preset: str) -> TokenizerFamily:
    """The tokenizer family of `preset`; ValueError naming it when it has none."""
    get_preset(preset)  # ValueError listing the presets for an unknown name
    if preset not in PRESET_TO_FAMILY:
        raise ValueError(f"preset {preset!r} has no built-in tokenizer")
    return FAMILIES[PRESET_TO_FAMILY[preset]]


def load_preset_tokenizer(preset: str) -> PreTrainedTokenizerFast:
    """The tokenizer of `preset` with its chat template, read from package data."""
    family = preset_tokenizer_family(preset)
    data = resources.files(__name__).joinpath(f"data/{family.name}.json")
    backend = Tokenizer.from_str(data.read_text(encoding="utf-8"))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=family.bos_token, eos_token=family.eos_token,
        pad_token=family.pad_token, extra_special_tokens=list(family.markers),
        chat_template=family.chat_template,
        model_max_length=get_preset(preset).max_model_len,
        clean_up_tokenization_spaces=False)


__all__ = ["FAMILIES", "PRESET_TO_FAMILY", "TokenizerFamily", "load_preset_tokenizer",
           "preset_tokenizer_family"]
