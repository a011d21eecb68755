"""`hybridkv serve` runs its engine in a process of its own (the default): the process
tree, a clean stop, and what each side does when the other dies."""

import os
import signal
import threading
import time

import httpx
from server_process import serve, wait_until


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _greedy(server) -> list[str]:
    client = server.client()
    texts = []
    for prompt in ("The cache holds", "Sliding windows and", "A block of tokens"):
        chunks = client.completions.create(model="gemma3-tiny", prompt=prompt, max_tokens=12,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        texts.append("".join(c.choices[0].text for c in chunks if c.choices))
    return texts


def test_engine_runs_in_its_own_process_and_stops_with_the_server(server_logs):
    in_thread = serve("gemma3-tiny", "--no-engine-process", log_dir=server_logs)
    try:
        assert _children(in_thread.proc.pid) == []
        expected = _greedy(in_thread)
    finally:
        assert in_thread.stop() == 0
    server = serve("gemma3-tiny", log_dir=server_logs)
    engines = _children(server.proc.pid)
    try:
        assert len(engines) == 1, engines
        assert _greedy(server) == expected  # same tokens as the engine on a thread
        idle = server.wait_idle()
        assert idle["vllm:num_requests_running"] == 0
        assert idle["vllm:generation_tokens_total"] == 36  # counted in the engine process
    finally:
        assert server.stop() == 0
    assert not _alive(engines[0])


def test_engine_process_killed_fails_requests_and_the_server_exits_nonzero(server_logs):
    server = serve("gemma3-tiny", log_dir=server_logs)
    (engine,) = _children(server.proc.pid)
    answer = {}

    def in_flight():
        body = {"model": "gemma3-tiny", "prompt": [3, 4, 5], "max_tokens": 4000,
                "ignore_eos": True}
        answer["response"] = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)

    runner = threading.Thread(target=in_flight)
    runner.start()
    wait_until(lambda: server.metrics()["vllm:num_requests_running"] == 1, what="running")
    os.kill(engine, signal.SIGKILL)
    runner.join(60)
    response = answer["response"]
    assert response.status_code == 500
    assert "engine process exited" in response.json()["error"]["message"]
    server.proc.wait(60)
    assert server.proc.returncode == 1
    assert "exiting after the engine failed" in server.log_text()


def test_engine_process_exits_when_the_server_is_killed(server_logs):
    server = serve("gemma3-tiny", log_dir=server_logs)
    (engine,) = _children(server.proc.pid)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    deadline = time.monotonic() + 30
    while _alive(engine) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(engine), "the engine process outlived its server"
    server.stop()
