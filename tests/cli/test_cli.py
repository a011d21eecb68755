"""The hybridkv command line: demo, simulate, bench; one-line errors for bad arguments."""

import json
import subprocess
import sys

import pytest

from hybridkv.kv_cache.checks import parse_bytes
from hybridkv.models.layouts import KNOWN_MODELS, model_layout
from hybridkv.tools.cli import main
from hybridkv.tools.simulate import load_trace, simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "hybridkv.tools.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args, match", [
    (["demo", "--presets", "no-such-preset", "--no-progress"], "unknown preset"),
    (["simulate", "--model", "gemma-3-27b", "--memory", "lots"], "--memory"),
    (["simulate", "--model", "gemma-3-27b", "--memory", "1GiB", "--trace", "/no/file"],
     "neither a file"),
    (["simulate", "--model", "unknown-model", "--memory", "1GiB"], "unknown model"),
    (["simulate", "--model", "jamba-1.5-mini", "--memory", "1MiB"], "raise the budget"),
    (["bench", "no-such-bench"], "unknown benchmark"),
    (["no-such-command"], "invalid choice"),
])
def test_bad_arguments_give_one_line_and_exit_2(args, match):
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_malformed_jsonl_line_is_named(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"prompt": [1, 2, 3]}) + "\n{not json}\n")
    with pytest.raises(ValueError, match=r"trace.jsonl:2: malformed"):
        load_trace(str(trace))
    trace.write_text(json.dumps({"prompt": [1, -2]}) + "\n")
    with pytest.raises(ValueError, match=r":1: malformed"):
        load_trace(str(trace))
    assert main(["simulate", "--model", "gpt-oss-120b", "--memory", "1GiB",
                 "--trace", str(trace)]) == 2


@pytest.mark.parametrize("text, value", [("40GiB", 40 * 2**30), ("512MB", 512 * 10**6),
                                         ("1.5KiB", 1536), ("1000", 1000)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_known_model_layouts_follow_their_published_configs():
    gemma = model_layout("gemma-3-27b", 16)
    kinds = [type(s).__name__ for s in gemma.values()]
    assert len(kinds) == 62 and kinds.count("FullAttentionSpec") == 10
    assert all(kinds[i] == "FullAttentionSpec" for i in range(5, 62, 6))
    jamba = [type(s).__name__ for s in model_layout("jamba-1.5-mini", 16).values()]
    assert jamba.count("FullAttentionSpec") == 4 and jamba.count("MambaSpec") == 28
    scout = [type(s).__name__ for s in model_layout("llama-4-scout", 16).values()]
    assert scout.count("ChunkedLocalAttentionSpec") == 36
    oss = [type(s).__name__ for s in model_layout("gpt-oss-120b", 16).values()]
    assert oss.count("SlidingWindowSpec") == 18 == oss.count("FullAttentionSpec")
    assert set(KNOWN_MODELS) == {"gemma-3-27b", "gpt-oss-120b", "jamba-1.5-mini",
                                 "llama-4-scout"}


def test_simulated_hit_rate_grows_with_the_budget(tmp_path):
    trace = tmp_path / "t.jsonl"
    doc = list(range(3, 2051))
    rows = [{"prompt": doc[:1024 + 256 * (i % 4)] + [5000 + i] * 32, "max_tokens": 8}
            for i in range(24)]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    layout = model_layout("gpt-oss-120b", 16)
    small = simulate(layout, 150 * 2**20, load_trace(str(trace)))
    large = simulate(layout, 2 * 2**30, load_trace(str(trace)))
    assert large.hit_rate > 0.5 and large.requests == 24
    assert small.hit_rate <= large.hit_rate
    assert large.evictions == 0


def test_simulate_command_writes_a_plot(tmp_path):
    out = tmp_path / "sim"
    code = main(["simulate", "--model", "gpt-oss-120b", "--memory", "2GiB",
                 "--trace", "few-shot", "--sweep", "0.5,1", "--out", str(out)])
    assert code == 0
    assert (out / "hit_rate_vs_budget.png").read_bytes()[:8] == PNG_MAGIC
