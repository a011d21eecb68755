"""Block hashing throughput: ns per token of `compute_block_hashes`, block size 16.

    python benchmarks/bench_hashing.py [--repeats 9] [--sizes 1024,8192] [--out DIR] [--quick]

Prompts are fixed SplitMix64 token streams (the same ids as the shared
benchmark's `traces.make_hash_prompt`, regenerated here). Each cell is the
median of `--repeats` timed calls after one warm-up call. Three paths are
measured: the C extension with the CPU's best SHA-256 (SHA-NI where the CPU
has it), the C extension with its portable SHA-256 (xxhash is the same code
in both), and the pure-Python reference path (the extension disabled in
`hybridkv.kv_cache.hashing`). Results and machine details go to
`DIR/hashing.json`.
"""

from __future__ import annotations

import argparse
import os
import platform
import ssl
import statistics
import time

import xxhash
from common import add_common_args, prepare_out, write_result

from hybridkv.kv_cache import hashing

SIZES = (1024, 8192, 32768, 131072)
QUICK_SIZES = (1024, 8192)
BLOCK_SIZE = 16
TARGETS = {"sha256": 15.0, "xxhash": 8.0}  # ns/token, C path
_MASK64 = (1 << 64) - 1


def _splitmix_tokens(num_tokens: int, vocab_size: int = 32000) -> list[int]:
    """`traces.make_hash_prompt(num_tokens)` (seed 0) without the traces module."""
    stream_id = 1_000_000 + num_tokens
    state = (stream_id * 0x9E3779B97F4A7C15) & _MASK64
    out = []
    for _ in range(num_tokens):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        out.append((z ^ (z >> 31)) % vocab_size)
    return out


def ns_per_token(tokens: list[int], algo: str, repeats: int) -> float:
    """Median wall time of one `compute_block_hashes` call, per token."""
    hashing.compute_block_hashes(tokens, BLOCK_SIZE, hash_algo=algo)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        hashing.compute_block_hashes(tokens, BLOCK_SIZE, hash_algo=algo)
        times.append(time.perf_counter_ns() - t0)
    return round(statistics.median(times) / len(tokens), 2)


def bench_path(prompts: dict[int, list[int]], repeats: int) -> dict[str, dict[str, float]]:
    """{algo: {num_tokens: ns/token}} for the path `hashing` currently uses."""
    return {algo: {str(n): ns_per_token(toks, algo, repeats) for n, toks in prompts.items()}
            for algo in hashing.HASH_ALGOS}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "openssl_of_hashlib": ssl.OPENSSL_VERSION,
        "hashing_backend": hashing.hashing_backend().describe(),
        "xxhash_python": xxhash.VERSION,
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def print_table(path: str, rows: dict[str, dict[str, float]]) -> None:
    sizes = list(next(iter(rows.values())))
    print(f"{path:>14} {'algo':>7} " + " ".join(f"{s:>9}" for s in sizes) + "   (ns/token)")
    for algo, row in rows.items():
        print(f"{'':>14} {algo:>7} " + " ".join(f"{row[s]:>9.2f}" for s in sizes))


def bench_paths(prompts: dict[int, list[int]], repeats: int) -> dict[str, dict]:
    """{path: {algo: {num_tokens: ns/token}}}: C (best SHA-256), C portable, Python."""
    paths = {}
    extension = hashing._chainhash
    if extension is not None:
        best = extension.force_portable_sha256(False)
        paths[f"c ({best})"] = bench_path(prompts, repeats)
        if best != "portable":
            try:
                extension.force_portable_sha256(True)
                paths["c (portable)"] = bench_path(prompts, repeats)
            finally:
                extension.force_portable_sha256(False)
    try:
        hashing._chainhash = None
        paths["python"] = bench_path(prompts, repeats)
    finally:
        hashing._chainhash = extension
    return paths


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=None, help=f"default {','.join(map(str, SIZES))}")
    ap.add_argument("--repeats", type=int, default=9)
    add_common_args(ap)
    args = ap.parse_args(argv)
    if args.repeats < 5:
        ap.error("--repeats must be >= 5")
    prepare_out(args.out)
    sizes = args.sizes.split(",") if args.sizes else (QUICK_SIZES if args.quick else SIZES)
    prompts = {n: _splitmix_tokens(n) for n in map(int, sizes)}
    repeats = 5 if args.quick else args.repeats
    machine = machine_info()  # load average as the runs start
    paths = bench_paths(prompts, repeats)
    result = {"benchmark": "compute_block_hashes", "unit": "ns/token", "statistic": "median",
              "block_size": BLOCK_SIZE, "repeats": repeats,
              "token_source": "splitmix64 (traces.make_hash_prompt ids)",
              "extension_built": hashing._chainhash is not None, "targets_c": TARGETS,
              "machine_details": machine, "paths": paths}
    for path, rows in paths.items():
        print_table(path, rows)
    print("wrote", write_result("hashing", result, args.out))
    return result


if __name__ == "__main__":
    main()
