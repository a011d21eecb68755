"""SLOW-ISH (about 30-60 s): every `hybridkv bench NAME` runs from the repository alone
and leaves the source tree as it was.

Each benchmark listed by `hybridkv bench --help` runs with `--quick` (its
smallest settings) through the real runner, from a temporary working
directory: its JSON must land in `./hybridkv-bench-output/` there, and the
checkout must be unchanged (`git status`, when the tree is a git checkout, and
the committed figures in benchmarks/results/ byte for byte in any case).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from hybridkv.tools.bench import SCRIPTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
# the JSON file each benchmark writes
OUTPUT = {"engine": "engine_gemma3-tiny.json", "serving": "serving_gemma3-tiny.json"}


def git_status() -> str | None:
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
        return None
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def committed_results() -> dict[str, str]:
    out = {}
    for folder, _, names in os.walk(RESULTS):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, RESULTS)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_every_bench_runs_quick_from_the_repo_and_leaves_the_tree_clean(tmp_path):
    status, results = git_status(), committed_results()
    env = {**os.environ, "PYTHONPATH": ROOT}
    for name in SCRIPTS:
        proc = subprocess.run([sys.executable, "-m", "hybridkv.tools.cli", "bench", name,
                               "--quick"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"{name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        written = tmp_path / "hybridkv-bench-output" / OUTPUT.get(name, f"{name}.json")
        assert written.is_file(), (name, proc.stdout[-1000:])
        assert f"wrote hybridkv-bench-output{os.sep}{written.name}" in proc.stdout
    assert committed_results() == results
    assert git_status() == status


def test_bench_out_flag_and_an_unwritable_out_fail_before_the_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = tmp_path / "mine"
    proc = subprocess.run([sys.executable, "-m", "hybridkv.tools.cli", "bench", "pool",
                           "--quick", "--out", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and (out / "pool.json").is_file(), proc.stderr
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "hybridkv.tools.cli", "bench", "soak",
                           "--out", str(afile / "x")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "soak:" not in proc.stdout  # no soak ran
    assert proc.stderr.strip().endswith(f"--out {afile / 'x'}: cannot write there "
                                        "(Not a directory)")


@pytest.mark.parametrize("name", ["replay", "pressure"])
def test_shared_bench_cross_check_needs_the_folder(tmp_path, name):
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "hybridkv.tools.cli", "bench", name,
                           "--quick", "--shared-bench", str(tmp_path / "none")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "--shared-bench" in proc.stderr and "no traces.py there" in proc.stderr
