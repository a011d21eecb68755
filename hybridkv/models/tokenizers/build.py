"""Train the presets' tokenizers from the corpus shipped with the package.

    python -m hybridkv.models.tokenizers.build [--out DIR]

writes one `<family>.json` (a `tokenizers` file) per family plus
`build_info.json` into DIR (default: this package's `data/` folder, where
the committed files live). Each is a byte-level BPE: the 256 byte symbols,
the family's special tokens at ids 0, 1, 2, ... and merges learned from
`data/corpus.txt` (plain English text written for this package and
released with it) until the vocabulary reaches the smallest `vocab_size`
of the family's presets. Byte-level means any UTF-8 text encodes and
decodes back unchanged. Training is deterministic: the same corpus and
`tokenizers` version give byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from importlib import resources
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from hybridkv.models.presets import get_preset
from hybridkv.models.tokenizers.families import FAMILIES, PRESET_TO_FAMILY, TokenizerFamily

DATA_DIR = Path(__file__).resolve().parent / "data"
BUILD_INFO = "build_info.json"


def corpus_text() -> str:
    """The training corpus shipped in the package."""
    return resources.files("hybridkv.models.tokenizers").joinpath("data/corpus.txt").read_text(
        encoding="utf-8")


def family_vocab_size(family: str) -> int:
    """The smallest `vocab_size` among the presets of `family`."""
    sizes = [int(get_preset(preset).build_config().vocab_size)
             for preset, name in PRESET_TO_FAMILY.items() if name == family]
    if not sizes:
        raise ValueError(f"tokenizer family {family!r} is used by no preset")
    return min(sizes)


def train(family: TokenizerFamily, vocab_size: int, corpus: str) -> Tokenizer:
    """A byte-level BPE with `family`'s special tokens first, at most `vocab_size` ids."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=family.special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    tokenizer.post_processor = _post_processor(family, tokenizer)
    return tokenizer


def _post_processor(family: TokenizerFamily, tokenizer: Tokenizer) -> processors.PostProcessor:
    """Prepend the bos token when the family adds one, else only byte-level offsets."""
    if not family.add_bos:
        return processors.ByteLevel(trim_offsets=False)
    bos = family.bos_token
    bos_id = tokenizer.token_to_id(bos)
    return processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                         special_tokens=[(bos, bos_id)])


def build(out_dir: Path) -> list[Path]:
    """Train every family into `out_dir`; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = corpus_text()
    written = []
    for name, family in FAMILIES.items():
        path = out_dir / f"{name}.json"
        path.write_text(train(family, family_vocab_size(name), corpus).to_str(pretty=True)
                        + "\n", encoding="utf-8")
        written.append(path)
    info = {"tokenizers_version": tokenizers.__version__,
            "corpus_sha256": hashlib.sha256(corpus.encode("utf-8")).hexdigest()}
    info_path = out_dir / BUILD_INFO
    info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return [*written, info_path]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR,
                        help="output folder (default: the package's data folder)")
    args = parser.parse_args(argv)
    for path in build(args.out):
        print(path)


if __name__ == "__main__":
    main()
