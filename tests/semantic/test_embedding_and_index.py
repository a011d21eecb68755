"""The bundled embedding loads with no network and matches wordllama's own
inference code; the ANN index finds what brute force finds."""

import socket
from pathlib import Path

import numpy as np
import pytest

from hybridkv.semantic.embedding import (
    WORDLLAMA_TOKENIZER,
    WORDLLAMA_WEIGHTS,
    load_embedder,
    wordllama_embedder,
)
from hybridkv.semantic.index import VectorIndex

SENTENCES = ["What is the capital of France?", "How do I reverse a list in Python?",
             "Is coffee bad for your health?", ""]


def test_weights_ship_in_the_wheel_and_load_offline(monkeypatch):
    import wordllama

    root = Path(wordllama.__file__).parent
    assert (root / WORDLLAMA_WEIGHTS).stat().st_size > 10_000_000
    assert (root / WORDLLAMA_TOKENIZER).is_file()

    def no_network(*args, **kwargs):
        raise AssertionError("the embedder tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    vectors = wordllama_embedder().embed(SENTENCES)
    assert vectors.shape == (4, 256) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors[:3], axis=1), 1.0, atol=1e-5)
    assert not vectors[3].any()  # nothing to embed


def test_matches_wordllamas_own_inference():
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference

    ours = wordllama_embedder()
    with safe_open(str(Path(__import__("wordllama").__file__).parent / WORDLLAMA_WEIGHTS),
                   framework="np") as f:
        table = f.get_tensor("embedding.weight")
    theirs = WordLlamaInference(table, Tokenizer.from_file(str(
        Path(__import__("wordllama").__file__).parent / WORDLLAMA_TOKENIZER)))
    expected = theirs.embed(SENTENCES[:3], norm=True)
    assert np.allclose(ours.embed(SENTENCES[:3]), expected, atol=2e-3)


def test_bad_embedding_option_names_it():
    with pytest.raises(ValueError, match="--semantic-embedding 'no/such/dir'"):
        load_embedder("no/such/dir")


def test_index_agrees_with_brute_force():
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3000, 32)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    index = VectorIndex(32)
    index.add_many(np.arange(3000, dtype=np.uint64), data)
    queries = data[:200] + 0.05 * rng.standard_normal((200, 32)).astype(np.float32)
    found = [index.search(q, 1)[0] for q in queries]
    truth = np.argmax(queries @ data.T, axis=1)
    assert np.mean([k == t for (k, _), t in zip(found, truth)]) >= 0.97
    for (k, sim), q in zip(found, queries):
        assert sim == pytest.approx(float(data[k] @ q), abs=1e-4)
    index.remove(int(truth[0]))
    assert int(truth[0]) not in index and len(index) == 2999
    assert index.search(queries[0], 1)[0][0] != truth[0]
