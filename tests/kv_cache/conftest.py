"""Fixtures shared by the KV cache tests."""

from __future__ import annotations

import os

import pytest

from hybridkv.kv_cache import fastpath


@pytest.fixture(scope="module")
def native():
    """The C fast path module; skipped when disabled on purpose, a failure when not built."""
    if fastpath.native is None:
        if os.environ.get(fastpath.DISABLE_ENV) == "1":
            pytest.skip(f"C fast path disabled ({fastpath.DISABLE_ENV}=1)")
        pytest.fail(f"C fast path not built: {fastpath.NATIVE_ERROR}")
    return fastpath.native
