"""Block pool operations against pool size: the per-operation cost must stay flat.

For pools of 1k to 1M blocks: take + cache a batch of blocks, free them,
touch them back (a hit), free again, evict. Reports ns per block operation.

    python benchmarks/bench_pool.py [--sizes 1000,10000,100000,1000000] [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import add_common_args, prepare_out, write_result

from hybridkv.kv_cache.block_pool import BlockPool

BATCH = 256


def one_round(pool: BlockPool, round_id: int) -> dict[str, float]:
    """Time each operation over one batch of BATCH blocks (ns per block)."""
    t = {}
    t0 = time.perf_counter_ns()
    blocks = pool.get_new_blocks(BATCH)
    t["take"] = time.perf_counter_ns() - t0
    t0 = time.perf_counter_ns()
    for i, b in enumerate(blocks):
        pool.cache_block(b, round_id.to_bytes(8, "little") + i.to_bytes(8, "little"), 0)
    t["cache"] = time.perf_counter_ns() - t0
    t0 = time.perf_counter_ns()
    pool.free_blocks(reversed(blocks))
    t["free"] = time.perf_counter_ns() - t0
    t0 = time.perf_counter_ns()
    pool.touch(blocks)
    t["touch"] = time.perf_counter_ns() - t0
    pool.free_blocks(reversed(blocks))
    t0 = time.perf_counter_ns()
    pool.evict_blocks([b.block_id for b in blocks[:BATCH // 2]])
    t["evict"] = time.perf_counter_ns() - t0
    return {k: v / BATCH for k, v in t.items()}


def bench_size(num_blocks: int, rounds: int) -> dict[str, float]:
    pool = BlockPool(num_blocks)
    warm = pool.get_new_blocks(num_blocks - 1)  # fill the cache so takes evict
    for i, b in enumerate(warm):
        pool.cache_block(b, b"w" + i.to_bytes(8, "little"), 0)
    pool.free_blocks(warm)
    samples = [one_round(pool, r) for r in range(rounds)]
    return {op: round(statistics.median(s[op] for s in samples), 1) for op in samples[0]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000,1000000")
    ap.add_argument("--rounds", type=int, default=200)
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    if args.quick:
        args.sizes, args.rounds = "1000,10000", 20
    result = {}
    for size in map(int, args.sizes.split(",")):
        result[str(size)] = bench_size(size, args.rounds)
        print(f"{size:>9} blocks  ns/block: {result[str(size)]}")
    print("wrote", write_result("pool", {"ns_per_block": result, "batch": BATCH}, args.out))
    return result


if __name__ == "__main__":
    main()
