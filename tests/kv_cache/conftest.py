"""Fixtures shared by the KV cache tests.

Both backends under one suite: a test module that declares
`pytestmark = pytest.mark.both_backends` runs each of its tests twice, once on
the C backend (`[c]`) and once on the pure-Python reference (`[python]`),
as CPython runs its tests against a module and its C accelerator. Managers
the test builds without naming a backend take the one under test (through
HYBRIDKV_DISABLE_FASTPATH, which `KVCacheManager` reads when it is built).
The `[c]` variants skip, with the reason, when the extension is not built.
"""

from __future__ import annotations

import os

import pytest

from hybridkv.kv_cache import fastpath


def pytest_configure(config):
    config.addinivalue_line("markers", "both_backends: run each test on the C backend and on "
                                       "the pure-Python reference")


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("both_backends"):
        metafunc.parametrize("backend", fastpath.BACKENDS, indirect=True, ids=str)


@pytest.fixture(autouse=True)
def backend(request, monkeypatch):
    """The backend the managers of this test run on ("c" or "python"), or None
    where the module does not run on both (the default backend then)."""
    name = getattr(request, "param", None)
    if name == "c" and fastpath.native is None:
        pytest.skip(f"C fast path not available: {fastpath.NATIVE_ERROR}")
    if name == "python":
        monkeypatch.setenv(fastpath.DISABLE_ENV, "1")
    elif name == "c":
        monkeypatch.delenv(fastpath.DISABLE_ENV, raising=False)
    return name


@pytest.fixture(scope="module")
def native():
    """The C fast path module; skipped when disabled on purpose, a failure when not built."""
    if fastpath.native is None:
        if os.environ.get(fastpath.DISABLE_ENV) == "1":
            pytest.skip(f"C fast path disabled ({fastpath.DISABLE_ENV}=1)")
        pytest.fail(f"C fast path not built: {fastpath.NATIVE_ERROR}")
    return fastpath.native
