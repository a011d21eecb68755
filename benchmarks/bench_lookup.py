"""Prefix lookup cost against prefix length, per attention type.

For each type a single-group manager caches one prompt of N tokens (1k to
128k), then `get_computed_blocks` is timed for a request sharing the whole
prompt (hashes computed beforehand, so only the search is timed). The cost
must grow at most linearly in the blocks a search actually looks up.

    python benchmarks/bench_lookup.py [--lengths 1024,8192,32768,131072] [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from common import add_common_args, prepare_out, write_result

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

BLOCK = 16
TYPES = {
    "full": FullAttentionSpec(BLOCK),
    "sliding_window_1024": SlidingWindowSpec(BLOCK, sliding_window=1024),
    "chunked_8192": ChunkedLocalAttentionSpec(BLOCK, attention_chunk_size=8192),
    "mamba": MambaSpec(BLOCK),
    "sink_full": SinkFullAttentionSpec(BLOCK, sink_len=BLOCK),
}


def measure(spec, length: int, repeats: int) -> dict[str, float]:
    num_blocks = length // BLOCK + 64
    mgr = KVCacheManager(KVCacheConfig(num_blocks, [KVCacheGroupSpec(["l"], spec)]))
    rng = random.Random(length)
    prompt = [rng.randrange(32000) for _ in range(length)]
    first = Request("first", prompt)
    assert mgr.allocate_slots(first, length) is not None
    first.num_computed_tokens = length
    mgr.free(first)
    times, hit = [], 0
    for i in range(repeats):
        req = Request(f"q{i}", prompt + [1])
        req.block_hashes(mgr.hash_algo, mgr.hash_block_size)  # hash outside the timing
        t0 = time.perf_counter_ns()
        _, hit = mgr.get_computed_blocks(req)
        times.append(time.perf_counter_ns() - t0)
    us = statistics.median(times) / 1e3
    return {"hit_tokens": hit, "lookup_us": round(us, 2),
            "ns_per_prefix_block": round(us * 1e3 / (length // BLOCK), 1)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,8192,32768,131072")
    ap.add_argument("--repeats", type=int, default=15)
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    if args.quick:
        args.lengths, args.repeats = "1024,8192", 3
    result: dict[str, dict] = {}
    for name, spec in TYPES.items():
        result[name] = {}
        for length in map(int, args.lengths.split(",")):
            result[name][str(length)] = measure(spec, length, args.repeats)
            print(f"{name:22s} {length:>7} tokens: {result[name][str(length)]}")
    print("wrote", write_result("lookup", {"lookup": result, "block_size": BLOCK}, args.out))
    return result


if __name__ == "__main__":
    main()
