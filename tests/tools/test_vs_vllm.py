"""The parts of the vLLM comparison that need no vLLM: trace files, driver hooks, the
hybridkv worker, and the clear exit when no vLLM is given.

Oracles: a trace read back equals the generated one (tokens, ids, waits) and
a changed token is refused by the fingerprint; a hooked replay against the
plain one on the same trace (same hits, every chunk end where the hook put
it, one `new_step` per step); the worker's hybridkv side against the closed
form of the shared-prefix hit rate and an in-process replay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.tools.bench_traces import multi_turn_round_robin, shared_prefix_trace
from hybridkv.tools.replay import ManagerAdapter, make_config, replay
from hybridkv.tools.trace_file import MAGIC, load_trace, save_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")
ENV = {**os.environ, "PYTHONPATH": ROOT}


def small_trace():
    return shared_prefix_trace(num_requests=12, prefix_len=64, unique_len=20, decode_steps=3)


@pytest.mark.parametrize("make", [small_trace, lambda: multi_turn_round_robin(
    num_sessions=3, num_turns=3, system_len=20, first_message=(30, 50), message=(5, 15))])
def test_trace_file_round_trip(tmp_path, make):
    trace = make()
    path = str(tmp_path / "t.trace")
    save_trace(trace, path)
    back = load_trace(path)
    assert back == trace and back.fingerprint() == trace.fingerprint()
    assert [r.after for r in back.requests] == [r.after for r in trace.requests]


def test_trace_file_refuses_changed_tokens_and_other_files(tmp_path):
    trace = small_trace()
    path = tmp_path / "t.trace"
    save_trace(trace, str(path))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the last decode token of the last request
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"records {trace.fingerprint()}"):
        load_trace(str(path))
    path.write_bytes(b"not a trace\n")
    with pytest.raises(ValueError, match="not a hybridkv trace file"):
        load_trace(str(path))
    path.write_bytes(MAGIC + b'{"name":"x","params":{},"fingerprint":"f","requests":'
                     b'[["a",null,2,0]]}\n' + b"\0" * 4)
    with pytest.raises(ValueError, match="1 token ids, the header lists 2"):
        load_trace(str(path))


class AlignedAdapter(ManagerAdapter):
    """hybridkv's manager with a scheduler that ends prefill chunks on 16-token blocks."""

    def __init__(self, config):
        super().__init__(KVCacheManager(config))
        self.steps = 0
        self.chunk_ends: list[tuple[int, int]] = []  # (end, prompt length) of prefill chunks

    def new_step(self):
        self.steps += 1

    def clip_chunk(self, req, n):
        start = req.num_computed_tokens + self._hits.get(req.request_id, (None, 0))[1]
        end = start + n
        if end < req.num_prompt_tokens:
            end = end // 16 * 16
        return max(end - start, 0)

    def allocate(self, req, num_tokens):
        ok = super().allocate(req, num_tokens)
        if ok and req.num_computed_tokens <= req.num_prompt_tokens:
            self.chunk_ends.append((req.num_computed_tokens, req.num_prompt_tokens))
        return ok


def test_driver_hooks_clip_chunks_and_mark_steps():
    trace = small_trace()
    plain = replay(trace.requests, ManagerAdapter(KVCacheManager(make_config("mamba", 256))),
                   max_running=4, max_batched_tokens=70, timed=True)
    hooked = AlignedAdapter(make_config("mamba", 256))
    res = replay(trace.requests, hooked, max_running=4, max_batched_tokens=70, timed=True)
    assert res.finished == plain.finished == 12
    assert res.request_hits == plain.request_hits
    assert res.request_hits == {f"req-{i}": 0 if i == 0 else 64 for i in range(12)}
    assert hooked.steps == res.steps == res.calls["new_step"]
    assert plain.calls["new_step"] == 0
    assert all(end % 16 == 0 or end == prompt for end, prompt in hooked.chunk_ends)
    assert any(end % 16 != 0 and end != prompt for end, prompt in plain_chunk_ends(trace))
    assert hooked.num_free_blocks == 255


def plain_chunk_ends(trace):
    """The unclipped driver's prefill chunk ends on the same settings (the hook changed them)."""
    class Recorder(AlignedAdapter):
        def clip_chunk(self, req, n):
            return n

    adapter = Recorder(make_config("mamba", 256))
    replay(trace.requests, adapter, max_running=4, max_batched_tokens=70)
    return adapter.chunk_ends


def run_worker(tmp_path, *args):
    return subprocess.run([sys.executable, os.path.join(BENCH, "vs_vllm_worker.py"), *args],
                          capture_output=True, text=True, env=ENV, timeout=300)


@pytest.mark.parametrize("config", ["full", "swa", "mamba"])
def test_worker_hybridkv_side(tmp_path, config):
    trace = small_trace()
    path = str(tmp_path / "t.trace")
    save_trace(trace, path)
    done = run_worker(tmp_path, "--side", "hybridkv", "--config", config, "--trace", path,
                      "--fingerprint", trace.fingerprint(), "--num-blocks", "256",
                      "--window", "32", "--max-running", "4", "--warmup", "3")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["finished"] == 12 and result["leaked_blocks"] == 0
    assert result["hit_rate"] == pytest.approx(11 * 64 / (12 * 84), abs=1e-5)
    adapter = ManagerAdapter(KVCacheManager(make_config(config, 256, window=32)))
    direct = replay(trace.requests, adapter, max_running=4)
    assert result["request_hits"] == [direct.request_hits[r.request_id] for r in trace.requests]
    assert result["info"]["hybridkv"] and result["fingerprint"] == trace.fingerprint()


def test_worker_refuses_another_fingerprint(tmp_path):
    path = str(tmp_path / "t.trace")
    save_trace(small_trace(), path)
    done = run_worker(tmp_path, "--side", "hybridkv", "--config", "full", "--trace", path,
                      "--fingerprint", "0123456789abcdef")
    assert done.returncode != 0 and "expected 0123456789abcdef" in done.stderr


def vllm_importable(python: str) -> bool:
    return subprocess.run([python, "-c", "import vllm"], capture_output=True).returncode == 0


@pytest.mark.parametrize("given", [None, sys.executable, "/nonexistent/python"])
def test_bench_exits_clearly_without_vllm(tmp_path, given):
    if given == sys.executable and vllm_importable(given):
        pytest.skip("this Python has vLLM")
    env = {k: v for k, v in ENV.items() if k != "HYBRIDKV_VLLM_PYTHON"}
    cmd = [sys.executable, os.path.join(BENCH, "bench_vs_vllm.py"), "--quick",
           "--out", str(tmp_path / "out")]
    if given:
        cmd += ["--vllm-python", given]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and not (tmp_path / "out").exists()
    expected = {None: "no Python with vLLM 0.32.0 given",
                sys.executable: "cannot import vLLM's KV cache manager",
                "/nonexistent/python": "cannot run it"}[given]
    assert expected in done.stderr and "--vllm-python" in done.stderr


def fake_shared_folder(tmp_path):
    """A folder shaped like the shared workload folder (its scripts are not run)."""
    folder = tmp_path / "shared-bench"
    folder.mkdir()
    (folder / "traces.py").write_text("")
    (folder / "hybridkv_bench.py").write_text("")
    return folder


@pytest.mark.parametrize("given", [None, "/nonexistent/python"])
def test_shared_runner_comparison_exits_clearly_without_vllm(tmp_path, given):
    env = {k: v for k, v in ENV.items() if k != "HYBRIDKV_VLLM_PYTHON"}
    cmd = [sys.executable, os.path.join(BENCH, "bench_vs_vllm_shared.py"), "--quick",
           "--shared-bench", str(fake_shared_folder(tmp_path)), "--out", str(tmp_path / "out")]
    if given:
        cmd += ["--vllm-python", given]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and not (tmp_path / "out").exists()
    expected = "no Python with vLLM 0.32.0 given" if given is None else "cannot run it"
    assert expected in done.stderr and "--vllm-python" in done.stderr


@pytest.mark.parametrize("script, args, expected", [
    ("bench_vs_vllm_shared.py", ["--shared-bench", "/nonexistent"], "no traces.py there"),
    ("bench_vs_vllm_shared.py", ["--configs", "full,dense"], "use some of full, swa, mamba"),
    ("bench_vs_vllm_shared.py", ["--rounds", "0"], "--rounds must be >= 1"),
    ("vllm_shared_runner.py", ["--shared-bench", "/nonexistent"], "no traces.py there"),
    ("vllm_shared_runner.py", ["--parts", "full,dense"], "unknown config(s) ['dense']"),
])
def test_shared_runner_scripts_name_bad_arguments(tmp_path, script, args, expected):
    folder = str(fake_shared_folder(tmp_path))
    if "--shared-bench" not in args:
        args = ["--shared-bench", folder, *args]
    done = subprocess.run([sys.executable, os.path.join(BENCH, script), *args],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 1 and expected in done.stderr, done.stderr
