"""The README's examples that need no server run as printed: the KV cache
manager's, the engine's and the KV tier's (each shows real prefix reuse)."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_block(heading: str) -> str:
    """The first python code block after `heading`."""
    text = README.read_text()
    section = text[text.index(heading + "\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run(code: str) -> list[str]:
    """Run a README block in a fresh namespace; the lines it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {})
    return printed.getvalue().splitlines()


def test_readme_manager_example_prints_what_its_comments_say():
    code = python_block("## The KV cache manager")
    shown = [line[2:] for line in code.splitlines() if line.startswith("# r")]
    lines = run(code)
    assert lines == shown
    # the second request reuses the whole shared document (64 tokens: 4 full
    # blocks of 16 in every group), the first nothing
    assert lines[0].startswith("r1 0 (") and lines[1].startswith("r2 64 (")


def test_readme_engine_example_reuses_two_blocks():
    code = python_block("## The engine")
    assert "num_cached_tokens" in code
    first = run(code)[0]
    assert first == "32"  # what the comment in the README says it prints
    assert "# 32:" in code


def test_readme_tier_example_loads_the_prefix_from_the_store():
    code = python_block("## The KV tier")
    assert "# 48 48:" in code
    cached, external = map(int, run(code)[0].split())
    # 48: the longest multiple of every group's block size (16 and 48) within
    # the 65-token prompt; the pool evicted that document, so all of it came
    # from the store
    assert (cached, external) == (48, 48)
