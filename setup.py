"""Build of the C extensions; the project metadata lives in pyproject.toml.

Each needs only a C compiler and Python's headers and links no library but the
compiler's OpenMP runtime (the decode kernel's; torch's CPU operators load the same
`libgomp.so.1`):

- `hybridkv._native._chainhash` (chained block hashing): SHA-256 is written
  in the package (`_sha256.c`, with the x86 SHA extensions picked at run
  time) and xxHash is the vendored header-only library (`_vendor/xxhash.h`,
  BSD-2-Clause);
- `hybridkv._native._fastpath` (the KV cache manager's hot paths, `_fp_*.c`);
- `hybridkv._native._codec` (the KV tier's batch encoding and eviction selection);
- `hybridkv._native._decode_attn` (decode attention read in place from the paged
  KV cache, float32 CPU);
- `hybridkv._native._norm_rope` (RMSNorm, residual add and rotary embedding on
  float32 rows, built without fused multiply-adds so that it rounds as torch does).

The C sources live in `hybridkv/_native/`, the kernel's beside its Python wrapper
in `hybridkv/kernels/`.

When one cannot be built (no compiler, no Python headers) the install still
succeeds, prints a warning and leaves the reason beside the module
(`<module>.build-error.txt`); the package then warns once and runs the
pure-Python code instead (same results, slower: hashing about 7x, the
scheduler path several times; store payloads encoded in Python, same bytes).
"""

from __future__ import annotations

import os
import re
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

_BUILD_ERRORS = (CCompilerError, ExecError, PlatformError, OSError)
_NATIVE = os.path.join("hybridkv", "_native")

CHAINHASH = Extension(
    "hybridkv._native._chainhash",
    sources=[os.path.join(_NATIVE, name)
             for name in ("_chainhash.c", "_sha256.c", "_hashmemo.c")],
    depends=[os.path.join(_NATIVE, "_sha256.h"), os.path.join(_NATIVE, "_hashmemo.h"),
             os.path.join(_NATIVE, "_chainhash_api.h"),
             os.path.join(_NATIVE, "_vendor", "xxhash.h")],
    include_dirs=[_NATIVE],
    optional=True,
)
FASTPATH = Extension(
    "hybridkv._native._fastpath",
    sources=[os.path.join(_NATIVE, name) for name in (
        "_fp_module.c", "_fp_types.c", "_fp_request.c", "_fp_manager.c", "_fp_bind.c",
        "_fp_pool.c", "_fp_group.c", "_fp_release.c", "_fp_alloc.c", "_fp_lookup.c",
        "_fp_rules.c", "_fp_rules_take.c", "_fp_watch.c")],
    depends=[os.path.join(_NATIVE, name) for name in (
        "_fastpath.h", "_fp_rules.h", "_fp_watch.h", "_chainhash_api.h",
        "_py_constants.h")],
    include_dirs=[_NATIVE],
    optional=True,
)
CODEC = Extension(
    "hybridkv._native._codec",
    sources=[os.path.join(_NATIVE, name) for name in ("_codec.c", "_lrutable.c", "_recorder.c",
                                                         "_tailset.c")],
    depends=[os.path.join(_NATIVE, "_codec.h"), os.path.join(_NATIVE, "_vendor", "xxhash.h")],
    include_dirs=[_NATIVE],
    optional=True,
)
DECODE_ATTN = Extension(
    "hybridkv._native._decode_attn",
    sources=[os.path.join("hybridkv", "_native", "_decode_attn.c")],
    depends=[os.path.join(_NATIVE, "_simd.h")],
    include_dirs=[_NATIVE],
    extra_compile_args=["-fopenmp"],
    extra_link_args=["-fopenmp"],
    optional=True,
)
NORM_ROPE = Extension(
    "hybridkv._native._norm_rope",
    sources=[os.path.join("hybridkv", "_native", "_norm_rope.c")],
    depends=[os.path.join(_NATIVE, "_simd.h")],
    include_dirs=[_NATIVE],
    extra_compile_args=["-ffp-contract=off"],
    optional=True,
)
# what each extension does, and what runs instead when it is missing
_ROLES = {
    CHAINHASH.name: ("C hashing extension", "block hashing falls back to pure Python (~7x "
                                            "slower)"),
    FASTPATH.name: ("C fast-path extension", "the KV cache manager runs its pure-Python "
                                             "reference (several times slower)"),
    CODEC.name: ("C KV store codec", "KV store payloads are encoded in Python (slower)"),
    DECODE_ATTN.name: ("C decode attention kernel", "decode steps gather K and V in torch "
                                                    "(slower at large head sizes)"),
    NORM_ROPE.name: ("C norm and rotary kernel", "RMSNorms, residual adds and rotary "
                                                 "embeddings run as torch calls (slower on "
                                                 "small steps)"),
}


def build_error_file(ext_name: str) -> str:
    """The file recording why an extension was not built: `<module>.build-error.txt`."""
    return ext_name.rpartition(".")[2] + ".build-error.txt"


def _banner(ext_name: str, reason: str) -> None:
    line = "=" * 78
    what, fallback = _ROLES[ext_name]
    print(f"\n{line}\nWARNING: hybridkv's {what} {ext_name} was NOT built:\n"
          f"  {reason}\nhybridkv still works, but {fallback}.\nInstall a C compiler and "
          f"Python's headers (Debian: apt-get install gcc python3-dev)\nand reinstall to get "
          f"the fast path.\n{line}\n", file=sys.stderr)


# constants the C shares with Python, generated from the Python sources at build time so
# that the C never repeats them by hand: (header name, Python file, names)
_CONSTANTS_HEADER = os.path.join(_NATIVE, "_py_constants.h")
_CONSTANTS = (
    ("HKV_RATING_", os.path.join("hybridkv", "kv_cache", "eviction", "base.py"), "Rating",
     ("LOW_VALUE", "NORMAL_VALUE", "JUNCTION", "PROTECTED")),
    ("HKV_QUEUE_", os.path.join("hybridkv", "kv_cache", "eviction", "hybrid.py"), None,
     ("EMPTY", "LOW", "FRESH", "HIT", "KEPT")),
)


def _int_constants(path: str, class_name: str | None) -> dict[str, int]:
    """Integer constants assigned in `path` (inside `class_name`, else at module level):
    `NAME = <int>` and `A, B, C = range(n)`."""
    import ast
    with open(path, encoding="utf-8") as f:
        body = ast.parse(f.read()).body
    if class_name is not None:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == class_name)
    found: dict[str, int] = {}
    for node in body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) \
                and type(value.value) is int:
            found[target.id] = value.value
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Call) \
                and getattr(value.func, "id", None) == "range" and len(value.args) == 1:
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Name):
                    found[elt.id] = i
    return found


def write_constants_header() -> None:
    """Write `_py_constants.h` from the Python sources (raises naming a missing constant)."""
    lines = ["/* Generated by setup.py from the Python sources named below: do not edit. */",
             "#ifndef HKV_PY_CONSTANTS_H", "#define HKV_PY_CONSTANTS_H"]
    for prefix, path, class_name, names in _CONSTANTS:
        values = _int_constants(path, class_name)
        where = f"{path}" + (f" {class_name}" if class_name else "")
        lines.append(f"/* {where} */")
        for name in names:
            if name not in values:
                raise RuntimeError(f"setup.py: constant {name} not found in {where}")
            lines.append(f"#define {prefix}{name} {values[name]}")
    lines.append("#endif")
    text = "\n".join(lines) + "\n"
    old = open(_CONSTANTS_HEADER, encoding="utf-8").read() \
        if os.path.exists(_CONSTANTS_HEADER) else None
    if old != text:  # rewrite only on change, so that builds stay incremental
        with open(_CONSTANTS_HEADER, "w", encoding="utf-8") as f:
            f.write(text)


class OptionalBuildExt(build_ext):
    """build_ext that skips a C extension it cannot build, loudly, instead of failing.

    The reason is written beside where the module would be (the build folder
    and, for in-place and editable builds, the source package), so that the
    package can name it at run time: pip hides build output.
    """

    def run(self) -> None:
        self._failures: dict[str, str] = {}
        inplace = self.inplace or getattr(self, "editable_mode", False)
        write_constants_header()
        try:
            super().run()
        except _BUILD_ERRORS as err:  # no compiler at all, broken toolchain
            for ext in self.extensions:
                self._failures.setdefault(ext.name, _reason(err))
        for ext in self.extensions:
            reason = self._failures.get(ext.name)
            if reason is not None:
                _banner(ext.name, reason)
            for folder in self._module_folders(ext, inplace):
                _write_marker(os.path.join(folder, build_error_file(ext.name)), reason)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except _BUILD_ERRORS as err:  # compile or link error
            self._failures[ext.name] = _reason(err)

    def _module_folders(self, ext: Extension, inplace: bool) -> list[str]:
        folders = [os.path.dirname(os.path.join(self.build_lib, self.get_ext_filename(ext.name)))]
        if inplace:
            package = ext.name.rpartition(".")[0]
            folders.append(self.get_finalized_command("build_py").get_package_dir(package))
        return folders


def _reason(err: BaseException) -> str:
    """One line: the error, with a failed compiler command shortened to its program."""
    text = (str(err).strip() or "no message").splitlines()[0]
    failed = re.search(r"Command '\['([^']+)'.*returned non-zero exit status (\d+)", text)
    if failed:
        text = (f"the compiler ({failed.group(1)}) exited with status {failed.group(2)}; "
                f"pip install -v shows its messages")
    text = f"{type(err).__name__}: {text}"
    return text if len(text) <= 300 else text[:297] + "..."


def _write_marker(path: str, reason: str | None) -> None:
    """Record `reason` in `path`, or remove a stale record when the build worked."""
    if reason is None:
        if os.path.exists(path):
            os.remove(path)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(reason + "\n")


setup(ext_modules=[CHAINHASH, FASTPATH, CODEC, DECODE_ATTN, NORM_ROPE],
      cmdclass={"build_ext": OptionalBuildExt})
