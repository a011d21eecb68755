"""The C fast path (hybridkv._native._fastpath) decides exactly like the Python reference.

- replay digests (every block id handed out, every hit, stat and event, the
  final free queue and hash map) are equal with the extension and with
  HYBRIDKV_DISABLE_FASTPATH=1, on the scheduler-path trace, the pressure
  traces and random traffic on every group mix, under `lru` and `hybrid`;
- edge cases at its entry points (argument shapes, subclasses, numpy ints,
  errors, admissions with good and bad hits, custom manager types, caching
  off) come out the same on both paths (fastpath_cases.py);
- the backend in use is reported (fastpath_backend, `hybridkv --version`).

Without the extension these tests fail, unless HYBRIDKV_DISABLE_FASTPATH=1
says the Python path is intended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import fastpath_cases

from hybridkv.kv_cache import fastpath
from hybridkv.tools.cli import version_text
from hybridkv.tools.digest import run_digests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python_reference(args: list[str]) -> str:
    """stdout of `python args` with the C fast path disabled."""
    env = {**os.environ, fastpath.DISABLE_ENV: "1", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_replay_digests_equal_the_python_reference(native):
    with_c = run_digests(quick=True)
    reference = json.loads(_python_reference(["-m", "hybridkv.tools.digest", "--quick"]))
    assert len(with_c) > 50
    different = sorted(name for name in with_c if with_c[name] != reference.get(name))
    assert not different, different


def test_edge_cases_equal_the_python_reference(native):
    with_c = json.loads(json.dumps(fastpath_cases.observe(), default=repr))
    reference = json.loads(_python_reference([fastpath_cases.__file__]))
    for part, (mine, theirs) in enumerate(zip(with_c, reference)):
        assert len(mine) == len(theirs), part
        for i, (a, b) in enumerate(zip(mine, theirs)):
            assert a == b, (part, i, a, b)


def test_the_managers_run_in_c(native):
    from hybridkv import KVCacheManager, Request
    from hybridkv.tools.replay import make_config

    for config in ("full", "swa", "mamba"):
        kv = KVCacheManager(make_config(config, 64))
        assert kv._native, config
        assert type(Request("r", [1])).__mro__[1] is native.RequestCore


def test_backend_is_reported(native):
    assert fastpath.fastpath_backend() == (True, None)
    assert "KV cache fast path: C extension" in version_text()


def test_disabled_backend_is_named():
    out = _python_reference(["-m", "hybridkv.tools.cli", "--version"])
    assert "KV cache fast path: pure Python reference" in out
    assert fastpath.DISABLE_ENV in out
