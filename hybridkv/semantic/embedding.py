"""Sentence embeddings that work offline.

`load_embedder(None)` (the default) is the static 256-d model that the
`wordllama` package ships inside its wheel (`weights/l2_supercat_256.safetensors`
and the tokenizer beside it): a sentence is the mean of its tokens' vectors,
L2-normalised, about 0.1 ms on one core with nothing downloaded.
`load_embedder(DIR)` is a local sentence-transformers directory (a
`transformers` checkpoint, mean-pooled), read with `local_files_only`.
Every embedder returns float32 unit rows: cosine similarity is a dot product.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

WORDLLAMA_WEIGHTS = "weights/l2_supercat_256.safetensors"
WORDLLAMA_TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
MAX_TOKENS = 512


class Embedder(Protocol):
    dim: int
    name: str

    def embed(self, texts: list[str]) -> np.ndarray:
        """[len(texts), dim] float32, each row of unit length."""
        ...


def unit_rows(x: np.ndarray) -> np.ndarray:
    """`x` with every row scaled to length 1 (zero rows stay zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


class StaticEmbedder:
    """Mean of static token vectors: `table[token ids].mean()`, normalised."""

    def __init__(self, table: np.ndarray, tokenizer, name: str) -> None:
        self.table = table.astype(np.float32)  # [vocab, dim]
        self.tokenizer = tokenizer
        self.dim = int(table.shape[1])
        self.name = name

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, enc in enumerate(self.tokenizer.encode_batch(texts, add_special_tokens=False)):
            ids = [i for i in enc.ids[:MAX_TOKENS] if i < len(self.table)]
            if ids:
                out[row] = self.table[ids].mean(axis=0)
        return unit_rows(out)


def wordllama_embedder() -> StaticEmbedder:
    """The model bundled in the `wordllama` wheel; FileNotFoundError naming the
    file when the installed package lacks it (nothing is downloaded)."""
    import wordllama
    from safetensors import safe_open
    from tokenizers import Tokenizer

    root = Path(wordllama.__file__).parent
    weights, vocab = root / WORDLLAMA_WEIGHTS, root / WORDLLAMA_TOKENIZER
    for path in (weights, vocab):
        if not path.is_file():
            raise FileNotFoundError(f"the installed wordllama package has no {path}")
    with safe_open(str(weights), framework="np") as f:
        table = f.get_tensor("embedding.weight")
    return StaticEmbedder(table, Tokenizer.from_file(str(vocab)), "wordllama-l2-supercat-256")


class TransformerEmbedder:
    """A local sentence-transformers (or plain encoder) directory, mean-pooled."""

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).eval()
        self.dim = int(self.model.config.hidden_size)
        self.name = Path(path).name
        self._torch = torch

    def embed(self, texts: list[str]) -> np.ndarray:
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS,
                               return_tensors="pt")
        with self._torch.no_grad():
            hidden = self.model(**batch).last_hidden_state  # [B, T, H]
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return unit_rows(pooled.float().numpy())


def load_embedder(spec: str | None) -> Embedder:
    """The default bundled model (`None` or "wordllama"), or a local directory;
    ValueError naming `spec` when it is neither."""
    if spec is None or spec == "wordllama":
        return wordllama_embedder()
    if not Path(spec).is_dir():
        raise ValueError(f"--semantic-embedding {spec!r} is neither 'wordllama' nor a "
                         f"local model directory")
    return TransformerEmbedder(spec)
