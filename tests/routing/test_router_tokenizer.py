"""`hybridkv route --tokenizer DIR`: the router's own token ids equal the ones a
backend computes for the same prompt or chat (its `PromptBuilder` path)."""

from __future__ import annotations

import pytest

from hybridkv.engine.chat import render_chat
from hybridkv.serving.router.app import load_local_tokenizer, local_tokens
from hybridkv.tools.tokenizer_checkpoint import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer().save_pretrained(path)
    return str(path)


def test_local_tokens_match_the_backends(tokenizer_dir):
    backend_tokenizer = train_tokenizer()
    router_tokenizer = load_local_tokenizer(tokenizer_dir)
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "What is a sliding window?"},
                {"role": "assistant", "content": "A few recent tokens."},
                {"role": "user", "content": "And a state space layer?"}]
    assert local_tokens(router_tokenizer, {"messages": messages}) == \
        render_chat(backend_tokenizer, messages)
    text = "Prefix caching reuses the blocks of earlier prompts."
    assert local_tokens(router_tokenizer, {"prompt": text}) == \
        list(backend_tokenizer.encode(text))


def test_bad_inputs(tokenizer_dir, tmp_path):
    tokenizer = load_local_tokenizer(tokenizer_dir)
    assert local_tokens(tokenizer, {"messages": "not a list"}) == []
    assert local_tokens(tokenizer, {"prompt": None}) == []
    with pytest.raises(ValueError, match="--tokenizer"):
        load_local_tokenizer(str(tmp_path / "missing"))
