"""`hybridkv serve` under vLLM's flag names, with its operability features:
the startup summary, `/version`, `--access-log`, `--max-model-len`."""

from __future__ import annotations

import pytest
from server_process import serve

from hybridkv import LLM, __version__
from hybridkv.tools import cli


def _parse(*flags):
    return cli.build_parser().parse_args(["serve", "gemma3-tiny", *flags])


def test_vllm_flag_names_parse_beside_hybridkv_ones():
    args = _parse("--max-model-len", "256", "--no-enable-prefix-caching", "--block-size", "32",
                  "--max-num-seqs", "3", "--max-num-batched-tokens", "512",
                  "--served-model-name", "g", "--seed", "7", "--api-key", "k",
                  "--host", "127.0.0.1", "--port", "9")
    assert (args.max_model_len, args.enable_prefix_caching, args.block_size) == (256, False, 32)
    assert (args.max_num_seqs, args.max_num_batched_tokens, args.seed) == (3, 512, 7)
    assert (args.served_model_name, args.api_key, args.port) == ("g", "k", 9)
    assert _parse().enable_prefix_caching is True
    assert _parse("--enable-prefix-caching").enable_prefix_caching is True
    assert _parse("--no-prefix-caching").enable_prefix_caching is False


@pytest.fixture(scope="module")
def logged_server(tmp_path_factory):
    server = serve("gemma3-tiny", "--max-model-len", "64", "--access-log",
                   "--max-num-seqs", "2", "--num-blocks", "8",
                   log_dir=tmp_path_factory.mktemp("serve-logs"))
    yield server
    assert server.stop() == 0


def test_startup_summary_version_and_access_log(logged_server):
    assert logged_server.get("/version").json() == {"version": __version__}
    out = logged_server.client().completions.create(model="gemma3-tiny", prompt=[5, 6, 7],
                                                    max_tokens=2)
    assert out.usage.completion_tokens == 2
    log = logged_server.log_text()
    groups = LLM("gemma3-tiny", num_blocks=8).config.kv_cache_groups
    assert "pool: 8 blocks of 16 tokens" in log
    assert "KV cache groups: 0 sliding_window" in log
    assert f"{len(groups) - 1} full_attention" in log
    assert "max model length 64; prefix caching on; eviction policy hybrid" in log
    assert "fast paths: block hashing" in log
    assert "POST /v1/completions 200" in log and "GET /version 200" in log


def test_max_model_len_caps_the_context(logged_server):
    response = logged_server.post("/v1/completions",
                                  json={"prompt": [5] * 60, "max_tokens": 10})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "max_tokens" and "64" in error["message"]


def test_a_request_larger_than_the_pool_names_the_flags(logged_server):
    response = logged_server.post("/v1/completions", json={"prompt": [5] * 40,
                                                           "max_tokens": 8})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "--num-blocks" in message and "--kv-cache-bytes" in message
    assert "needs" in message and "of 7 usable" in message


def test_max_model_len_above_the_model_is_refused(capsys):
    assert cli.main(["serve", "gemma3-tiny", "--max-model-len", "999999", "--port", "1"]) == 2
    assert "--max-model-len 999999" in capsys.readouterr().err
