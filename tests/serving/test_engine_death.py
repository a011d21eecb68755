"""If the engine loop dies, every in-flight request gets a 500 naming the cause,
/health answers 503, and the process drains and exits non-zero (a supervisor
restarts it)."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from redis_fixture import free_port

FAULTY = Path(__file__).with_name("faulty_serve.py")


def _start(log_path):
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, str(FAULTY), "serve", "gemma3-tiny", "--port",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("server not healthy")


def test_engine_death_fails_requests_and_exits_nonzero(server_logs):
    proc, url = _start(server_logs / "faulty.log")
    try:
        slow = {}

        def in_flight():  # a long request running when the engine dies
            body = {"prompt": [3, 4, 5], "max_tokens": 2000, "ignore_eos": True}
            slow["response"] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)

        runner = threading.Thread(target=in_flight)
        runner.start()
        time.sleep(0.5)
        fatal = httpx.post(f"{url}/v1/completions", timeout=60,
                           json={"prompt": [5, 6], "max_tokens": 13})
        runner.join(60)
        for response in (fatal, slow["response"]):
            assert response.status_code == 500, response.text
            assert "injected engine fault" in response.json()["error"]["message"]
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "engine loop died" in (server_logs / "faulty.log").read_text()
