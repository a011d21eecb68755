"""`hybridkv demo`: figures from repeated runs, table and plot from the same data,
per-group figures that tell the groups apart, and errors before anything runs.

No timing is asserted: only where the numbers come from and what they count.
"""

import contextlib
import io
import math
import re

import pytest

from hybridkv import LLM
from hybridkv.models.presets import build_preset_model
from hybridkv.tools import demo
from hybridkv.tools.cli import main
from hybridkv.tools.demo_measure import (
    BLOCK_SIZE,
    WORKLOAD_PARAMS,
    make_engines,
    measure_ttft,
    measure_workload,
)
from hybridkv.tools.workloads import few_shot, shared_documents

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def engines():
    return make_engines(build_preset_model("gemma3-tiny", seed=0))


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One short demo run: (exit code, printed text, the TTFT points drawn, out dir)."""
    out_dir = tmp_path_factory.mktemp("demo")
    drawn = {}
    draw = demo.write_plots

    def capture(folder, sweeps, usage):
        drawn.update(sweeps)
        return draw(folder, sweeps, usage)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo, "write_plots", capture)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = demo.run_demo(str(out_dir), ("gemma3-tiny",), prefix_lengths=(256, 64),
                                 show_progress=False, repeats=2)
    return code, printed.getvalue(), drawn, out_dir


def test_demo_prints_medians_and_draws_the_plot_from_the_same_points(demo_run):
    code, out, drawn, out_dir = demo_run
    assert code == 0 and "outputs with caching off: identical (every run)" in out
    for name in ("hit_rate_and_ttft.png", "pool_usage.png"):
        assert (out_dir / name).read_bytes()[:8] == PNG_MAGIC
    points = drawn["gemma3-tiny"]
    assert [p.prefix_len for p in points] == [64, 256]
    assert all(len(s.values) == 2 for p in points for s in (p.miss, p.hit, p.off))
    last = points[-1]  # the table's TTFT line is the plot's longest prefix
    assert "256-token shared document" in out
    for label, samples in (("miss", last.miss), ("hit", last.hit), ("caching off", last.off)):
        assert (f"{label} {samples.median * 1e3:.1f} ms [{samples.low * 1e3:.1f}-"
                f"{samples.high * 1e3:.1f}]") in out
    assert "median of 2 timed run(s) after a warm-up run" in out
    rag = next(line for line in out.splitlines() if line.strip().startswith("shared documents"))
    assert float(rag.split()[2]) > 0.5  # the hit rate column comes from the run


def test_per_group_lines_show_what_each_group_holds(demo_run):
    out = demo_run[1]
    sliding = next(line for line in out.splitlines() if "0-2 sliding window 32" in line)
    full = next(line for line in out.splitlines() if "3 full attention" in line)
    cells = [re.findall(r"([\d,]+) / ([\d.]+) / (\d+)", line) for line in (sliding, full)]
    assert len(cells[0]) == len(cells[1]) == 3
    for (tokens_s, per_request_s, _), (tokens_f, per_request_f, _) in zip(*cells):
        assert tokens_s == tokens_f  # every group could reuse the whole hit
        # a sliding group holds its 32-token window: at most 3 blocks of 16
        assert float(per_request_s) <= 3 < float(per_request_f)


def test_group_figures_and_hits_match_a_fresh_engine(engines):
    # the first run of a workload on the demo's (reused, reset) engines is counted
    # as a brand-new engine would count it
    measure_workload(engines, "warm", lambda gen: gen(few_shot(256, 4)), repeats=1)
    prompts = shared_documents(num_docs=2, doc_len=256, questions_per_doc=3)
    result = measure_workload(engines, "docs", lambda gen: gen(prompts), repeats=1)
    fresh = LLM(build_preset_model("gemma3-tiny", seed=0), block_size=BLOCK_SIZE,
                num_blocks=engines[True].config.num_blocks)
    outs = fresh.generate(prompts, WORKLOAD_PARAMS)
    assert result.identical and result.num_requests == len(prompts)
    assert result.hit_rate == pytest.approx(fresh.stats.prefix_hit_rate)
    assert result.hit_rate == pytest.approx(sum(o.num_cached_tokens for o in outs)
                                            / sum(map(len, prompts)))
    stats = fresh.kv.prefix_cache_stats
    assert [g.reusable_tokens for g in result.groups] == stats.group_hits
    prompt_blocks = math.ceil(len(prompts[0]) / BLOCK_SIZE)
    full = result.groups[-1]
    assert prompt_blocks <= full.blocks_per_request <= prompt_blocks + 1
    assert all(g.blocks_per_request <= 3 for g in result.groups[:-1])
    assert len(result.rate_on.values) == len(result.rate_off.values) == 1


def test_ttft_points_count_the_reuse(engines):
    (point,) = measure_ttft(engines, (128,), repeats=3)
    assert point.prefix_len == 128 and len(point.hit.values) == 3
    assert point.reused == pytest.approx(128 / (128 + 24))  # the 128-token prefix, 8 blocks
    assert point.hit.low > 0 and point.miss.low > 0


@pytest.mark.parametrize("args, match", [
    (["--out", "/proc/no-such-dir"], "--out /proc/no-such-dir: cannot write there"),
    (["--repeats", "0"], "repeats must be an int >= 1"),
    (["--threads", "0"], "num_threads must be an int >= 1"),
    (["--presets", "gemma3-tiny,nope"], "unknown preset 'nope'"),
])
def test_bad_demo_arguments_fail_before_running(args, match, capsys, monkeypatch):
    monkeypatch.setattr(demo, "make_engines", _never)
    assert main(["demo", "--no-progress", *args]) == 2
    assert match in capsys.readouterr().err


def test_run_demo_checks_its_folder_before_running(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(demo, "make_engines", _never)
    with pytest.raises(ValueError, match="cannot write there"):
        demo.run_demo(str(tmp_path / "file" / "plots"), show_progress=False)


def _never(*args, **kwargs):
    raise AssertionError("the demo ran although its arguments were bad")
