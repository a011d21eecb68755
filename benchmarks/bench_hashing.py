"""Block hashing throughput: ns per token of `compute_block_hashes`, block size 16.

    python benchmarks/bench_hashing.py [--repeats 9] [--sizes 1024,8192] [--out FILE]

Prompts are the fixed token streams of the shared benchmark traces
(`traces.make_hash_prompt`), or the same SplitMix64 streams regenerated here
when that module is not found. Each cell is the median of `--repeats` timed
calls after one warm-up call. Both the C fast path and the pure-Python
reference path are measured (the latter by disabling the extension in
`hybridkv.kv_cache.hashing`). Results and machine details go to
`benchmarks/results/hashing.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import ssl
import statistics
import sys
import time
from pathlib import Path

import xxhash

from hybridkv.kv_cache import hashing

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "hashing.json"
SIZES = (1024, 8192, 32768, 131072)
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


def load_prompt_maker():
    """(make_prompt(n), source name): the shared traces module if importable."""
    try:
        import traces  # type: ignore[import-not-found]
    except ImportError:
        sys.path.insert(0, str(REPO.parent / "shared" / "bench"))
        try:
            import traces  # type: ignore[import-not-found]
        except ImportError:
            return _splitmix_tokens, "splitmix64 (built in)"
    return traces.make_hash_prompt, "traces.make_hash_prompt"


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
        "openssl": ssl.OPENSSL_VERSION,
        "xxhash_python": xxhash.VERSION,
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def print_table(path: str, rows: dict[str, dict[str, float]]) -> None:
    sizes = list(next(iter(rows.values())))
    print(f"{path:>6} {'algo':>7} " + " ".join(f"{s:>9}" for s in sizes) + "   (ns/token)")
    for algo, row in rows.items():
        print(f"{'':>6} {algo:>7} " + " ".join(f"{row[s]:>9.2f}" for s in sizes))


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.repeats < 5:
        ap.error("--repeats must be >= 5")
    make_prompt, source = load_prompt_maker()
    prompts = {n: make_prompt(n) for n in map(int, args.sizes.split(","))}
    machine = machine_info()  # load average as the runs start
    paths = {}
    extension = hashing._chainhash
    if extension is not None:
        paths["c"] = bench_path(prompts, args.repeats)
    try:
        hashing._chainhash = None
        paths["python"] = bench_path(prompts, args.repeats)
    finally:
        hashing._chainhash = extension
    result = {"benchmark": "compute_block_hashes", "unit": "ns/token", "statistic": "median",
              "block_size": BLOCK_SIZE, "repeats": args.repeats, "token_source": source,
              "extension_built": extension is not None, "targets_c": TARGETS,
              "machine": machine, "paths": paths}
    for path, rows in paths.items():
        print_table(path, rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
