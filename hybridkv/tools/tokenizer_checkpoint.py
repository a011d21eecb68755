"""A checkpoint directory with a real tokenizer, for tests and benchmarks of text
and chat: a preset's weights plus a small byte-level BPE trained here with the
`tokenizers` library (no download) and a plain chat template.

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
