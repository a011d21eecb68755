"""Imports point down only: the import-linter contracts in pyproject.toml hold.

The contracts are the oracle (written as rules, not derived from the code);
this runs the same check as the `lint-imports` command, in-process, so the
suite needs no console script on PATH.
"""

from pathlib import Path

from importlinter import cli

ROOT = Path(__file__).resolve().parents[1]


def test_every_import_contract_holds(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    config = str(ROOT / "pyproject.toml")
    status = cli.lint_imports(config_filename=config, no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert status == 0, report
    assert "0 broken" in report, report
