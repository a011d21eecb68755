"""`hybridkv route --semantic-cache`: the fleet-wide cache answers a paraphrase
at the router, without a backend."""

import pytest
from server_process import ServerProcess
from test_serving_cache import ask, unique


@pytest.fixture(scope="module")
def router(cached_pair, semantic_logs):
    proc = ServerProcess(["route", "--backend", cached_pair[0].url, "--check-interval", "0.3",
                          "--semantic-cache", "memory://?size=100",
                          "--semantic-error-bound", "none"], log_dir=semantic_logs)
    yield proc
    proc.stop()


def test_router_answers_a_paraphrase_itself(router):
    question = unique("What is the capital city of TOPIC?")
    header, answer = ask(router, question)
    assert header == "miss"
    client = router.client().with_options(api_key="key-a")
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-chat", messages=[{"role": "user", "content": question.replace(
            "What is", "What's")}], temperature=0.0, max_tokens=6)
    assert raw.headers["x-hybridkv-semantic-cache"].startswith("hit")
    assert "x-hybridkv-backend" not in raw.headers
    assert raw.parse().choices[0].message.content == answer
    assert ask(router, question, api_key="key-b")[0] == "miss"
