"""What a newcomer meets first on the command line: --version, output folders, units, flags.

Each case runs the real CLI (`main` in process, or `python -m hybridkv.tools.cli`
where warnings or exit output matter) and checks the one-line error names the
flag and value, that a bad output folder fails before any work starts, and
that the simulator reports warnings as notes instead of Python warnings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybridkv import __version__
from hybridkv.kv_cache.checks import format_bytes, parse_bytes
from hybridkv.kv_cache.hashing import hashing_backend
from hybridkv.tools import cli
from hybridkv.tools.simulate import parse_sweep


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hybridkv.tools.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_version_names_the_version_and_the_hashing_path(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"hybridkv {__version__}"
    assert hashing_backend().describe() in out
    expected = "C extension" if hashing_backend().c_extension else "pure Python fallback"
    assert expected in out


@pytest.fixture
def no_demo_run(monkeypatch):
    """Fails the test if the demo itself starts."""
    import hybridkv.tools.demo as demo

    def refuse(*args, **kwargs):
        raise AssertionError("the demo ran although its --out is not writable")

    monkeypatch.setattr(demo, "run_demo", refuse)


def test_demo_out_under_a_file_fails_before_the_run(tmp_path, capsys, no_demo_run):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert cli.main(["demo", "--out", str(afile / "x"), "--no-progress"]) == 2
    line = one_error_line(capsys)
    assert line.startswith("hybridkv demo: error: --out ") and str(afile / "x") in line
    assert "cannot write there" in line


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc on this system")
def test_demo_out_in_proc_fails_before_the_run(capsys, no_demo_run):
    assert cli.main(["demo", "--out", "/proc/nope"]) == 2
    assert "--out /proc/nope: cannot write there" in one_error_line(capsys)


def test_simulate_out_under_a_file_is_one_clear_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = run_cli("simulate", "--model", "gemma-3-27b", "--memory", "1GiB",
                   "--out", str(afile / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"hybridkv simulate: error: --out {afile / 'x'}: "
                                   "cannot write there (Not a directory)")


@pytest.mark.parametrize("sweep, bad", [("abc", "abc"), ("0.5,x", "x"), ("0,1", "0"),
                                        ("-1", "-1"), ("", ""), ("inf", "inf"),
                                        ("1,,2", "")])
def test_bad_sweep_names_the_flag(sweep, bad, capsys, tmp_path):
    code = cli.main(["simulate", "--model", "gemma-3-27b", "--memory", "1GiB",
                     "--sweep", sweep, "--out", str(tmp_path)])
    assert code == 2
    assert f"--sweep {sweep!r}: {bad!r} is not a positive budget multiplier" in \
        one_error_line(capsys)


def test_sweep_parses_multipliers():
    assert parse_sweep("0.25, 0.5,1,2") == [0.25, 0.5, 1.0, 2.0]


@pytest.mark.parametrize("text, value", [
    ("40GB", 40 * 10**9), ("40gb", 40 * 10**9), ("40 GB", 40 * 10**9), ("40GiB", 40 * 2**30),
    ("512MB", 512 * 10**6), ("512MiB", 512 * 2**20), ("1.5kB", 1500), ("1.5KiB", 1536),
    ("2TB", 2 * 10**12), ("1TiB", 2**40), ("1e9", 10**9), ("1E9B", 10**9)])
def test_memory_units_si_are_decimal_and_iec_binary(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["40G", "40 gigabytes", "-1GB", "0", "GB"])
def test_bad_memory_names_the_units(text):
    with pytest.raises(ValueError, match="--memory .* (units: kB MB GB TB|must be positive)"):
        parse_bytes(text)


def test_budgets_print_in_both_unit_systems():
    assert format_bytes(40 * 10**9) == "40.00 GB (37.25 GiB)"
    assert format_bytes(40 * 2**30) == "42.95 GB (40.00 GiB)"


def test_simulate_sweep_reports_warnings_as_notes_not_python_warnings(tmp_path):
    """A pool too small for the working set makes the manager warn; simulate prints a note."""
    docs = [list(range(3 + 2000 * d, 3 + 2000 * d + 1024)) for d in range(4)]
    rows = [{"prompt": docs[d] + [30000 + q * 10 + d] * 16, "max_tokens": 4}
            for q in range(6) for d in range(4)]
    trace = tmp_path / "docs.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    proc = run_cli("simulate", "--model", "gpt-oss-120b", "--memory", "200MiB", "--trace",
                   str(trace), "--sweep", "0.5,1,4", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr and ".py:" not in proc.stderr, proc.stderr
    assert "note: prefix caching: a prompt prefix was looked up" in proc.stdout
    assert "sweep x4: " in proc.stdout and "budget 0.21 GB (0.20 GiB)" in proc.stdout


def test_bench_help_lists_every_benchmark():
    from hybridkv.tools.bench import SCRIPTS

    proc = run_cli("bench", "--help")
    assert proc.returncode == 0
    for name, script in SCRIPTS.items():
        assert f"  {name:15s} {script.summary}" in proc.stdout


def test_bench_outside_a_checkout_says_so(monkeypatch, tmp_path, capsys):
    from hybridkv.tools import bench

    monkeypatch.setattr(bench, "PACKAGE_ROOT", str(tmp_path))
    assert cli.main(["bench", "hashing"]) == 2
    line = one_error_line(capsys)
    assert "not installed with the package" in line and "source checkout" in line


def test_the_output_check_leaves_no_folder_when_the_run_then_fails(tmp_path, capsys):
    out = tmp_path / "new" / "sub"
    code = cli.main(["simulate", "--model", "gemma-3-27b", "--memory", "1KiB",
                     "--trace", "few-shot", "--out", str(out)])
    assert code == 2 and "kv_cache_memory_bytes=1024" in one_error_line(capsys)
    assert not (tmp_path / "new").exists()
