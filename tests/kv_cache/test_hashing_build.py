"""The C hashing extension builds from the package alone and says loudly when it is missing.

- SHA-256 written in C (SHA-NI and portable) against hashlib, XXH3 against the
  xxhash package, on every message length up to 300 bytes and long random ones;
- the sources include no system OpenSSL or xxHash header and link no library;
- a failed build (compiler replaced by `false`) still installs, prints a
  warning and records the reason, which the package names in a RuntimeWarning
  on the first hash (once), in `hashing_backend()` and in `hybridkv --version`.

Without the extension these tests fail, unless HYBRIDKV_ALLOW_PYTHON_HASHING=1.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import struct
import subprocess
import sys

import pytest
import xxhash

from hybridkv.kv_cache import hashing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE = os.path.join(ROOT, "hybridkv", "_native")
SOURCES = ("_chainhash.c", "_sha256.c", "_sha256.h", "_hashmemo.c", "_hashmemo.h")


@pytest.fixture
def ext():
    if hashing.EXTENSION_ERROR is not None:
        if os.environ.get(hashing.ALLOW_PYTHON_ENV) == "1":
            pytest.skip(f"C hashing extension not built, {hashing.ALLOW_PYTHON_ENV}=1")
        pytest.fail(f"C hashing extension not built: {hashing.EXTENSION_ERROR}")
    return hashing._chainhash


def _messages() -> list[bytes]:
    rng = random.Random(7)
    lengths = list(range(0, 300)) + [rng.randrange(300, 20000) for _ in range(60)]
    return [rng.randbytes(n) for n in lengths]


def _backends(ext) -> list[str]:
    """The SHA-256 code paths this CPU can run: portable, and SHA-NI if it has it."""
    best = ext.force_portable_sha256(False)
    return sorted({"portable", best})


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_c_digests_equal_the_python_packages(ext, algo):
    """chain() over one block of one token: digest(message || token as LE uint32)."""
    oracle = {"sha256": lambda d: hashlib.sha256(d).digest(),
              "xxhash": xxhash.xxh3_128_digest}[algo]
    algo_id = {"sha256": 0, "xxhash": 1}[algo]
    backends = _backends(ext) if algo == "sha256" else ["-"]
    try:
        for backend in backends:
            if backend != "-":
                assert ext.force_portable_sha256(backend == "portable") == backend
            for i, msg in enumerate(_messages()):
                token = (i * 2654435761) % 2**32
                got = ext.chain(algo_id, msg, [token], 0, 1, 1, b"")
                assert got == [oracle(msg + struct.pack("<I", token))], (backend, len(msg))
    finally:
        ext.force_portable_sha256(False)


def test_sha_ni_is_used_when_the_cpu_has_it(ext):
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
    has_sha = " sha_ni" in flags and " sse4_1" in flags
    assert ext.sha256_backend() == ("sha-ni" if has_sha else "portable")
    assert hashing.hashing_backend() == (True, ext.sha256_backend(), None)


def test_sources_need_no_system_crypto_or_xxhash_headers():
    for name in SOURCES:
        with open(os.path.join(NATIVE, name)) as f:
            includes = re.findall(r'^\s*#\s*include\s*([<"][^>"]+[>"])', f.read(), re.M)
        assert includes, name
        for inc in includes:
            assert "openssl" not in inc and inc != "<xxhash.h>", (name, inc)
    with open(os.path.join(ROOT, "setup.py")) as f:
        setup_text = f.read()
    assert "libraries=" not in setup_text and "crypto" not in setup_text


def test_the_extension_links_no_library(ext):
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) not installed")
    out = subprocess.run([readelf, "-d", ext.__file__], capture_output=True, text=True,
                         check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    assert all(lib.startswith(("libc.so", "libpthread.so", "libm.so")) for lib in needed), needed


def _copy_sources(dst) -> str:
    """setup.py, pyproject.toml, README.md and the package (no compiled module) in dst."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), dst)
    shutil.copytree(os.path.join(ROOT, "hybridkv"), os.path.join(dst, "hybridkv"),
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "*.txt"))
    return str(dst)


def _run(args, cwd, **env):
    full_env = {k: v for k, v in os.environ.items() if k != hashing.ALLOW_PYTHON_ENV}
    full_env.update(PYTHONPATH=cwd, PYTHONWARNINGS="default", **env)
    return subprocess.run(args, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=300)


HASH_TWICE = ("from hybridkv import compute_block_hashes as h; "
              "h(list(range(64)), 16); h(list(range(64)), 16, hash_algo='xxhash')")


MAKE_MANAGER = ("from hybridkv import KVCacheManager; from hybridkv.tools.replay import "
                "make_config; KVCacheManager(make_config('full', 8)); "
                "KVCacheManager(make_config('swa', 8))")


def test_failed_build_installs_warns_and_is_named_at_run_time(tmp_path):
    src = _copy_sources(tmp_path)
    build = _run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], src, CC="false")
    assert build.returncode == 0, build.stderr
    assert "C hashing extension hybridkv._native._chainhash was NOT built" in build.stderr
    marker = os.path.join(src, "hybridkv", "_native", "_chainhash.build-error.txt")
    with open(marker) as f:
        assert f.read().startswith("CompileError: the compiler (false) exited with status 1")

    run = _run([sys.executable, "-c", HASH_TWICE], src)
    warnings = [ln for ln in run.stderr.splitlines() if "RuntimeWarning" in ln]
    assert len(warnings) == 1, run.stderr  # once per process
    assert "C hashing extension not built (build failed: CompileError" in warnings[0]
    assert "falls back to pure Python, ~7x slower" in warnings[0]
    quiet = _run([sys.executable, "-c", HASH_TWICE], src, **{hashing.ALLOW_PYTHON_ENV: "1"})
    assert "RuntimeWarning" not in quiet.stderr, quiet.stderr

    version = _run([sys.executable, "-m", "hybridkv.tools.cli", "--version"], src)
    assert version.returncode == 0, version.stderr
    assert "pure Python fallback" in version.stdout and "CompileError" in version.stdout
    # the manager's fast path: the same story
    assert "C fast-path extension hybridkv._native._fastpath was NOT built" in build.stderr
    assert os.path.exists(os.path.join(src, "hybridkv", "_native", "_fastpath.build-error.txt"))
    assert "KV cache fast path: pure Python reference" in version.stdout
    manager = _run([sys.executable, "-c", MAKE_MANAGER], src)
    assert manager.returncode == 0, manager.stderr
    warned = [ln for ln in manager.stderr.splitlines() if "fast-path extension not built" in ln]
    assert len(warned) == 1 and "build failed: CompileError" in warned[0], manager.stderr


def test_missing_module_is_named_and_a_good_build_clears_the_record(tmp_path):
    src = _copy_sources(tmp_path)
    run = _run([sys.executable, "-c", HASH_TWICE], src)
    assert "C hashing extension not built (no compiled module" in run.stderr, run.stderr
    marker = os.path.join(src, "hybridkv", "_native", "_chainhash.build-error.txt")
    with open(marker, "w") as f:
        f.write("stale\n")
    build = _run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], src)
    assert build.returncode == 0 and "NOT built" not in build.stderr, build.stderr
    assert not os.path.exists(marker)
    run = _run([sys.executable, "-c", HASH_TWICE + "; from hybridkv.kv_cache import hashing; "
                "print(hashing.hashing_backend().c_extension)"], src)
    assert run.stdout.strip() == "True" and "RuntimeWarning" not in run.stderr, run.stderr
