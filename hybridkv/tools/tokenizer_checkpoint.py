"""Checkpoint and tokenizer directories for tests and benchmarks of text and chat.

- `save_checkpoint_with_tokenizer`: a preset's weights plus a small byte-level
  BPE trained here with the `tokenizers` library (no download) and a plain
  chat template;
- `save_preset_tokenizer`: the tokenizer a preset is served with (its
  family's BPE and chat template) as a directory, for `hybridkv route
  --tokenizer DIR` in front of `hybridkv serve PRESET`;
- `save_full_attention_checkpoint`: a tiny Qwen2-style model with full
  attention on every layer (no sliding window) and the Qwen2 preset's
  tokenizer, a checkpoint any engine that serves Qwen2 can load.

    path = save_checkpoint_with_tokenizer(tmp_path / "ckpt", "gemma3-tiny")
    llm = LLM(str(path))          # llm.tokenizer encodes text, renders chat
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def sample_text() -> str:
    """English text that ships with the package (the presets' tokenizer corpus)."""
    from hybridkv.models.tokenizers.build import corpus_text

    return corpus_text()


def train_tokenizer(vocab_size: int = 480):
    """A byte-level BPE `PreTrainedTokenizerFast`; ids 0/1/2 are <pad>/<s>/</s> (as in
    the presets' configs), `encode` prepends <s>, and it has `CHAT_TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([sample_text()] * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_checkpoint_with_tokenizer(path: str | Path, preset: str = "gemma3-tiny",
                                   seed: int = 0) -> Path:
    """Write `preset`'s weights (built with `seed`) and `train_tokenizer()` to `path`."""
    from hybridkv.models.presets import build_preset_model

    path = Path(path)
    build_preset_model(preset, seed=seed).save_pretrained(path)
    train_tokenizer().save_pretrained(path)
    return path


def save_preset_tokenizer(path: str | Path, preset: str) -> Path:
    """Write the tokenizer `hybridkv serve PRESET` uses (with its chat template) to
    `path`; ValueError naming the preset when it has none."""
    from hybridkv.models.tokenizers import load_preset_tokenizer

    path = Path(path)
    load_preset_tokenizer(preset).save_pretrained(path)
    return path


def save_full_attention_checkpoint(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen2 model whose layers all use full attention (the
    `qwen2-tiny` preset with its sliding window turned off) and that preset's
    tokenizer to `path`."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridkv.models.presets import get_preset

    path = Path(path)
    config = get_preset("qwen2-tiny").build_config(
        use_sliding_window=False, sliding_window=None, max_window_layers=0,
        max_position_embeddings=4096)
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(path)
    save_preset_tokenizer(path, "qwen2-tiny")
    return path
