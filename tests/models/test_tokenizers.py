"""The presets' built-in tokenizers: offline, byte-exact, inside the vocabulary, with
each family's chat format."""

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import tokenizers
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from hybridkv.models import list_presets
from hybridkv.models.presets import get_preset
from hybridkv.models.tokenizers import (
    FAMILIES,
    PRESET_TO_FAMILY,
    load_preset_tokenizer,
    preset_tokenizer_family,
)
from hybridkv.models.tokenizers.build import DATA_DIR, build, corpus_text

PRESETS = list_presets()
# one preset per family is enough where only the tokenizer file matters
FAMILY_PRESETS = sorted({family: preset for preset, family in PRESET_TO_FAMILY.items()}.values())

SAMPLES = [
    "Hello, world!", "", " ", "  leading and trailing  ", "tabs\tand\nnew\r\nlines\n\n",
    "naïve café, Grüße, señor", "日本語のテキストと中文", "emoji 🎉🦊👩‍👩‍👧 ok", "مرحبا بالعالم",
    "e\u0301 combining", "\x00\x01\x7f control", "zero\u200bwidth", "x" * 300, "123,456.789",
    "def f(x):\n    return {'a': [1, 2]}", "\U0010ffff last code point",
]


@cache
def tokenizer(preset):
    return load_preset_tokenizer(preset)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_every_preset_has_a_family_and_a_tokenizer():
    assert set(PRESET_TO_FAMILY) == set(PRESETS)
    assert set(PRESET_TO_FAMILY.values()) == set(FAMILIES)
    for preset in PRESETS:
        assert isinstance(tokenizer(preset), PreTrainedTokenizerFast)


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="'nope-tiny'"):
        load_preset_tokenizer("nope-tiny")


@pytest.mark.parametrize("preset", PRESETS)
def test_ids_fit_the_vocabulary_and_specials_match_the_config(preset):
    tok, config = tokenizer(preset), get_preset(preset).build_config()
    assert len(tok) <= config.vocab_size
    assert max(tok.get_vocab().values()) < config.vocab_size
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (
        config.pad_token_id, config.bos_token_id, config.eos_token_id)
    family = preset_tokenizer_family(preset)
    assert tok.convert_tokens_to_ids(family.special_tokens) == list(
        range(len(family.special_tokens)))
    assert set(family.special_tokens) <= set(tok.all_special_tokens)


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_fixed_samples_round_trip(preset):
    tok, vocab_size = tokenizer(preset), get_preset(preset).build_config().vocab_size
    for text in SAMPLES:
        ids = tok.encode(text, add_special_tokens=False)
        assert all(0 <= i < vocab_size for i in ids)
        assert tok.decode(ids) == text
        assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_round_trips(preset, text):
    tok = tokenizer(preset)
    # text spelling a special token encodes to that token (tested below), which decoding
    # with skip_special_tokens drops on purpose
    assume(not any(special in text for special in tok.get_added_vocab()))
    ids = tok.encode(text, add_special_tokens=False)
    assert max(ids, default=0) < get_preset(preset).build_config().vocab_size
    assert tok.decode(ids) == text
    with_specials = tok.encode(text)
    assert tok.decode(with_specials, skip_special_tokens=True) == text
    if preset_tokenizer_family(preset).add_bos:
        assert with_specials == [tok.bos_token_id, *ids]
    else:
        assert with_specials == ids


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_special_token_text_is_one_id_and_skippable(preset):
    tok = tokenizer(preset)
    family = preset_tokenizer_family(preset)
    text = "a" + "b".join(family.special_tokens) + "c"
    ids = tok.encode(text, add_special_tokens=False)
    assert [i for i in ids if i < len(family.special_tokens)] == list(
        range(len(family.special_tokens)))
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "a" + "b" * (
        len(family.special_tokens) - 1) + "c"


def test_trained_merges_compress_english():
    tok = tokenizer("gemma3-tiny")
    text = "The weather today will be mostly sunny, with a few clouds in the afternoon."
    assert len(tok.encode(text, add_special_tokens=False)) < len(text.encode()) / 2


def test_loading_needs_no_network(tmp_path):
    """In a fresh process with the hub off, an empty cache and sockets refused."""
    script = (
        "import socket\n"
        "def refuse(*a, **k):\n"
        "    raise AssertionError('network used')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "from hybridkv.models import list_presets\n"
        "from hybridkv.models.tokenizers import load_preset_tokenizer\n"
        "for name in list_presets():\n"
        "    tok = load_preset_tokenizer(name)\n"
        "    assert tok.decode(tok.encode('hi 🦊'), skip_special_tokens=True) == 'hi 🦊'\n"
        "print('ok', len(list_presets()))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[2])}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", str(len(PRESETS))]


def test_committed_files_match_the_corpus_and_the_build_script(tmp_path):
    info = json.loads((DATA_DIR / "build_info.json").read_text())
    import hashlib

    assert info["corpus_sha256"] == hashlib.sha256(corpus_text().encode()).hexdigest()
    if info["tokenizers_version"] != tokenizers.__version__:
        pytest.skip(f"files built with tokenizers {info['tokenizers_version']}, "
                    f"{tokenizers.__version__} installed")
    build(tmp_path)
    for family in FAMILIES:
        assert (tmp_path / f"{family}.json").read_bytes() == (
            DATA_DIR / f"{family}.json").read_bytes(), family
