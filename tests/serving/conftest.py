"""Session-scoped servers (one per model, started on first use) and reference engines."""

import pytest
from server_process import serve

from hybridkv import LLM
from hybridkv.tools.tokenizer_checkpoint import save_checkpoint_with_tokenizer

API_KEY = "test-key"


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("server-logs")


def _serve(model, logs, *args, api_key=None):
    server = serve(model, *args, log_dir=logs, api_key=api_key)
    yield server
    status = server.stop()
    assert status == 0, f"server exited with {status}:\n{server.log_text()[-3000:]}"


@pytest.fixture(scope="session")
def gemma_server(server_logs):
    """gemma3-tiny behind an API key, with a small body limit for the 413 case."""
    yield from _serve("gemma3-tiny", server_logs, "--max-body-bytes", "200000",
                      api_key=API_KEY)


@pytest.fixture(scope="session")
def gpt_oss_server(server_logs):
    yield from _serve("gpt-oss-tiny", server_logs)


@pytest.fixture(scope="session")
def jamba_server(server_logs):
    yield from _serve("jamba-tiny", server_logs)


@pytest.fixture(scope="session")
def text_checkpoint(tmp_path_factory):
    return save_checkpoint_with_tokenizer(tmp_path_factory.mktemp("ckpt") / "gemma3-tok")


@pytest.fixture(scope="session")
def text_server(server_logs, text_checkpoint):
    """A checkpoint with a real tokenizer and chat template, served as 'tiny-chat'."""
    yield from _serve(str(text_checkpoint), server_logs, "--served-model-name", "tiny-chat")


_REFERENCES = {}


@pytest.fixture(scope="session")
def reference():
    """`reference(model)`: an in-process LLM with the server's defaults, built once."""
    def get(model):
        if model not in _REFERENCES:
            _REFERENCES[model] = LLM(model)
        return _REFERENCES[model]
    return get
