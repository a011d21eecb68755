"""Servers with a semantic cache, started once per session on loopback."""

import pytest
from redis_fixture import RedisProcess
from server_process import serve

from hybridkv.tools.tokenizer_checkpoint import save_checkpoint_with_tokenizer

MODEL = "tiny-chat"


@pytest.fixture(scope="session")
def semantic_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("semantic-logs")


@pytest.fixture(scope="session")
def chat_checkpoint(tmp_path_factory):
    return save_checkpoint_with_tokenizer(tmp_path_factory.mktemp("ckpt") / "gemma3-tok")


@pytest.fixture(scope="session")
def semantic_redis(tmp_path_factory):
    """A Redis of the cache's own, which a test may kill and start again."""
    server = RedisProcess(tmp_path_factory.mktemp("semantic-redis"))
    server.start()
    yield server
    server.stop()


def _start(checkpoint, logs, url, *extra):
    """A server whose cache serves every candidate at or above the fixed threshold
    (`--semantic-error-bound none`), so that one paraphrase is enough to hit."""
    return serve(str(checkpoint), "--served-model-name", MODEL, "--semantic-cache", url,
                 "--semantic-error-bound", "none", *extra, log_dir=logs, wait=False)


@pytest.fixture(scope="session")
def cached_pair(chat_checkpoint, semantic_logs, semantic_redis):
    """Two servers sharing one Redis semantic cache (started side by side)."""
    servers = [_start(chat_checkpoint, semantic_logs, semantic_redis.url) for _ in range(2)]
    for server in servers:
        server.wait_healthy()
    yield servers
    for server in servers:
        assert server.stop() == 0, server.log_text()[-3000:]
