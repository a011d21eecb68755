"""file:// store: write and read throughput against the object size.

Chains of blocks (documents) are written interleaved, as write-behind batches
of evicted blocks arrive, then each chain is read back as one prefix `get`.
Per object size: write MB/s, read MB/s (through a new store instance, as a
later process reads; the files are in the page cache, so this measures the
store's own overhead: opens, reads, index), files written, and the time to
open the directory (indexing every object).

    python benchmarks/bench_file_store.py [--out DIR] [--quick]
        [--block-bytes 131072] [--objects 1,4,16,64,256] [--chains 32 --chain-blocks 64]

Object sizes are given in blocks per object. Writes DIR/file_store.json.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time

from common import add_common_args, prepare_out, write_result

from hybridkv.store.file import FileStore


def chains(num_chains: int, chain_blocks: int, block_bytes: int, seed: int = 0):
    rng = random.Random(seed)
    payload = os.urandom(block_bytes)
    keys = [[b"chain%04d-block%05d-%s" % (c, i, rng.randbytes(8).hex().encode())
             for i in range(chain_blocks)] for c in range(num_chains)]
    return keys, payload


def run_one(directory: str, keys, payload: bytes, object_blocks: int, batch: int) -> dict:
    block_bytes = len(payload)
    total = sum(map(len, keys)) * block_bytes
    store = FileStore(directory, 1 << 40, object_bytes=object_blocks * (block_bytes + 40))
    # write-behind order: batches of `batch` blocks from the chains in turn
    t0 = time.perf_counter()
    for start in range(0, len(keys[0]), batch):
        for chain in keys:
            run = chain[start:start + batch]
            store.put(run, [payload] * len(run))
    store.close()
    write_s = time.perf_counter() - t0
    files = len([n for n in os.listdir(directory) if n.endswith(".hkvo")])
    t0 = time.perf_counter()
    reader = FileStore(directory, 1 << 40)
    open_s = time.perf_counter() - t0
    reads = []
    for chain in keys:
        t0 = time.perf_counter()
        got = reader.get(chain)
        reads.append(time.perf_counter() - t0)
        assert len(got) == len(chain)
    read_s = sum(reads)
    return {"object_blocks": object_blocks, "files": files,
            "write_MB_per_s": total / write_s / 1e6, "read_MB_per_s": total / read_s / 1e6,
            "read_chain_ms_median": statistics.median(reads) * 1e3, "open_dir_ms": open_s * 1e3}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-bytes", type=int, default=131072)
    ap.add_argument("--objects", default="1,4,16,32,64,256")
    ap.add_argument("--chains", type=int, default=32)
    ap.add_argument("--chain-blocks", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="blocks per put (a write-behind batch)")
    ap.add_argument("--repeats", type=int, default=3)
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    if args.quick:
        args.objects, args.chains, args.chain_blocks, args.repeats = "1,16", 4, 8, 1
    keys, payload = chains(args.chains, args.chain_blocks, args.block_bytes)
    rows = []
    for _ in range(args.repeats):
        for n in map(int, args.objects.split(",")):
            directory = tempfile.mkdtemp(prefix="file-store-", dir=args.out)
            try:
                rows.append(run_one(directory, keys, payload, n, args.batch))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            print(rows[-1], flush=True)
    summary = {}
    for n in map(int, args.objects.split(",")):
        mine = [r for r in rows if r["object_blocks"] == n]
        summary[n] = {k: statistics.median(r[k] for r in mine) for k in mine[0]}
    result = {"args": vars(args), "rows": rows, "summary": summary}
    print("wrote", write_result("file_store", result, args.out))
    return result


if __name__ == "__main__":
    main()
