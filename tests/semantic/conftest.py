"""Servers with a semantic cache, started once per session on loopback."""

import pytest
from redis_fixture import free_port
from server_process import serve

from hybridkv.testing.tokenizer_checkpoint import save_checkpoint_with_tokenizer

MODEL = "tiny-chat"


@pytest.fixture(scope="session")
def semantic_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("semantic-logs")


@pytest.fixture(scope="session")
def chat_checkpoint(tmp_path_factory):
    return save_checkpoint_with_tokenizer(tmp_path_factory.mktemp("ckpt") / "gemma3-tok")


@pytest.fixture(scope="session")
def semantic_redis(redis_server):
    """The session's Redis, on a database of its own."""
    return redis_server.rsplit("/", 1)[0] + "/7"


def _start(checkpoint, logs, url):
    server = serve(str(checkpoint), "--served-model-name", MODEL, "--semantic-cache", url,
                   log_dir=logs)
    yield server
    assert server.stop() == 0, server.log_text()[-3000:]


@pytest.fixture(scope="session")
def cached_pair(chat_checkpoint, semantic_logs, semantic_redis):
    """Two servers sharing one Redis semantic cache."""
    first = _start(chat_checkpoint, semantic_logs, semantic_redis)
    second = _start(chat_checkpoint, semantic_logs, semantic_redis)
    yield next(first), next(second)
    for gen in (first, second):
        next(gen, None)


@pytest.fixture(scope="session")
def dead_redis_server(chat_checkpoint, semantic_logs):
    """A server whose semantic cache points at a Redis port nothing listens on."""
    gen = _start(chat_checkpoint, semantic_logs, f"redis://127.0.0.1:{free_port()}/0")
    yield next(gen)
    next(gen, None)
