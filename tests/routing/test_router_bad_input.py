"""The router answers bad input as its backends do, authenticates to them with
`--backend-api-key`, reports a backend that never became healthy, and counts
a stream whose backend died mid-way as failed."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest
from redis_fixture import free_port
from server_process import ServerProcess, serve, wait_until

MODEL = "gemma3-tiny"
KEY = "backend-secret"
SURROGATE = b'{"model": "gemma3-tiny", "prompt": "a\\ud800b", "max_tokens": 2}'


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("router-bad-input")


@pytest.fixture(scope="module")
def setup(logs):
    keyed = serve(MODEL, log_dir=logs, api_key=KEY, wait=False)
    victim = serve(MODEL, "--instance-id", "victim", log_dir=logs, wait=False)
    keyed.wait_healthy()
    victim.wait_healthy()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = ServerProcess(["route", "--check-interval", "0.3", "--backend", keyed.url,
                            "--backend", dead, "--backend-api-key", KEY], log_dir=logs)
    lone = ServerProcess(["route", "--check-interval", "0.3", "--backend", victim.url],
                         log_dir=logs)
    yield {"keyed": keyed, "victim": victim, "router": router, "lone": lone, "dead": dead}
    for proc in (router, lone, keyed, victim):
        proc.stop()


def _error(response, status, param):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    return error


def test_backend_api_key_is_sent(setup):
    out = setup["router"].client().completions.create(model=MODEL, prompt="hello there",
                                                      max_tokens=2)
    assert out.usage.completion_tokens == 2
    direct = httpx.post(f"{setup['keyed'].url}/v1/completions",
                        json={"prompt": [1, 2], "max_tokens": 1})
    assert direct.status_code == 401  # the backend does require the key


def test_bad_input_matches_the_backend(setup):
    router, keyed = setup["router"], setup["keyed"]
    headers = {"Content-Type": "application/json"}
    _error(keyed.post("/v1/completions", content=SURROGATE, headers=headers), 400, "body")
    _error(router.post("/v1/completions", content=SURROGATE, headers=headers), 400, "body")
    wrong = {"model": "gpt-4", "prompt": [1, 2], "max_tokens": 1}
    backend_error = _error(keyed.post("/v1/completions", json=wrong), 404, "model")
    router_error = _error(router.post("/v1/completions", json=wrong), 404, "model")
    assert router_error["code"] == backend_error["code"] == "model_not_found"
    _error(router.get("/no/such/path"), 404, None)
    _error(router.get("/v1/completions"), 405, None)


def test_a_backend_that_never_became_healthy_is_logged_and_shown(setup):
    router, dead = setup["router"], setup["dead"]
    wait_until(lambda: router.metrics().get(
        f"hybridkv_router_backend_checks_failed{{url={dead}}}", 0) >= 2)
    m = router.metrics()
    assert m[f"hybridkv_router_backend_up{{url={dead}}}"] == 0
    assert m[f"hybridkv_router_backend_up{{url={setup['keyed'].url}}}"] == 1
    assert f"backend {dead} has not become healthy" in router.log_text()


def test_a_stream_cut_mid_way_counts_as_failed(setup):
    lone, victim = setup["lone"], setup["victim"]
    seen, events = threading.Event(), []

    def stream():
        body = {"model": MODEL, "prompt": [3, 4, 5], "max_tokens": 3000, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{lone.url}/v1/completions", json=body,
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    seen.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert seen.wait(60)
    victim.proc.send_signal(signal.SIGKILL)
    reader.join(60)
    assert "backend_failed" in json.loads(events[-1][6:])["error"]["code"]
    m = lone.metrics()
    assert m["hybridkv_router_stream_failures_total{backend=victim}"] == 1
    assert m["hybridkv_router_requests_total{backend=victim,status=stream_failed}"] == 1
