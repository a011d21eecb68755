"""`hybridkv route --tokenizer DIR` with a preset's tokenizer written as a directory
(`save_preset_tokenizer`): the router's token ids equal what `hybridkv serve
PRESET` answers on `POST /tokenize`, and the router's `Server-Timing` header
names its stages, which together take no longer than the whole request."""

from __future__ import annotations

import time

import httpx
import pytest
from http_helpers import ServerProcess, serve

from hybridkv.serving.router.app import load_local_tokenizer, local_tokens
from hybridkv.tools.tokenizer_checkpoint import save_preset_tokenizer

CHATS = [
    [{"role": "user", "content": "What is a sliding window?"}],
    [{"role": "system", "content": "You answer briefly, in plain words."},
     {"role": "user", "content": "Compare a state space layer with attention."},
     {"role": "assistant", "content": "One keeps a state; the other keeps every key."},
     {"role": "user", "content": "Naïve question: which is cheaper — and why?"}],
]
TEXTS = ["Prefix caching reuses the blocks of earlier prompts.", "  spaced  out\nlines\t"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("local-tok-logs")
    tokenizer_dir = save_preset_tokenizer(tmp_path_factory.mktemp("tok"), "gemma3-tiny")
    backend = serve("gemma3-tiny", log_dir=logs)
    router = ServerProcess(["route", "--backend", backend.url, "--tokenizer",
                            str(tokenizer_dir), "--check-interval", "0.3"], log_dir=logs)
    yield backend, router, str(tokenizer_dir)
    router.stop()
    backend.stop()


def test_local_tokens_equal_the_backends_tokenize(cluster):
    backend, _, tokenizer_dir = cluster
    tokenizer = load_local_tokenizer(tokenizer_dir)
    for messages in CHATS:
        reply = backend.post("/tokenize", json={"messages": messages})
        assert reply.status_code == 200, reply.text
        assert local_tokens(tokenizer, {"messages": messages}) == reply.json()["tokens"]
    for text in TEXTS:
        reply = backend.post("/tokenize", json={"prompt": text})
        assert reply.status_code == 200, reply.text
        assert local_tokens(tokenizer, {"prompt": text}) == reply.json()["tokens"]


def test_server_timing_names_the_routers_stages(cluster):
    _, router, _ = cluster
    body = {"model": "gemma3-tiny", "messages": CHATS[1], "max_tokens": 2, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body,
                      timeout=60) as reply:
        elapsed = time.perf_counter() - start  # to the response headers
        assert reply.status_code == 200
        header = reply.headers["server-timing"]
        reply.read()
    stages = {}
    for part in header.split(","):
        name, _, duration = part.strip().partition(";dur=")
        stages[name] = float(duration)
    assert set(stages) == {"tokenize", "route", "backend"}
    assert all(ms >= 0 for ms in stages.values())
    assert sum(stages.values()) <= elapsed * 1e3


def test_unknown_preset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no-such-model"):
        save_preset_tokenizer(tmp_path, "no-such-model")
