"""Build of the optional C accelerator; the project metadata lives in pyproject.toml.

`hybridkv.kv_cache._chainhash` (chained block hashing) needs a C compiler, the
OpenSSL headers and libcrypto (Debian: libssl-dev) and the xxHash header and
library (Debian: libxxhash-dev). When any of them is missing the build still
succeeds without the extension and `hybridkv.kv_cache.hashing` uses its
pure-Python loop, which gives the same digests, only slower.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

_BUILD_ERRORS = (CCompilerError, ExecError, PlatformError, OSError)

CHAINHASH = Extension(
    "hybridkv.kv_cache._chainhash",
    sources=["hybridkv/kv_cache/_chainhash.c"],
    libraries=["crypto", "xxhash"],
    optional=True,
)


def _warn(ext_name: str, err: BaseException) -> None:
    print(f"WARNING: optional extension {ext_name} not built ({type(err).__name__}: {err}); "
          "hybridkv falls back to pure Python hashing", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that skips a C extension it cannot build instead of failing."""

    def run(self) -> None:
        try:
            super().run()
        except _BUILD_ERRORS as err:  # no compiler at all, broken toolchain
            _warn("extensions", err)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except _BUILD_ERRORS as err:  # missing header or library, compile error
            _warn(ext.name, err)


setup(ext_modules=[CHAINHASH], cmdclass={"build_ext": OptionalBuildExt})
