"""The README's engine example runs as printed and shows real prefix reuse."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def engine_snippet() -> str:
    text = README.read_text()
    section = text[text.index("## The engine"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_engine_example_reuses_two_blocks():
    code = engine_snippet()
    assert "num_cached_tokens" in code
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {})
    first = printed.getvalue().splitlines()[0]
    assert first == "32"  # what the comment in the README says it prints
    assert "# 32:" in code
