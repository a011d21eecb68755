"""What asking a shared Redis KV store costs the router, per request (`--kv-store`).

Starts a redis-server on a free 127.0.0.1 port (no persistence), binds
`--instances` backends of a model's cache layout to it, and stores the keys of
`--docs` documents (every group's block; the values are one byte: the router
never reads payloads). Then times `StoreView.stored` (build the keys, one
EXISTS script, merge the answer into per-slot bits) and `Router.route` with
that answer, for prompts whose document the store holds (`hit`) and fresh ones
(`miss`); median and p90 of `--queries` each.

    python benchmarks/bench_store_view.py --model gemma-3-27b
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import socket
import statistics
import subprocess
import time

from common import add_common_args, prepare_out, write_result

from hybridkv.kv_cache.hashing import compute_block_hashes
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.models.layouts import model_layout
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.routing import PromptHashes, Router
from hybridkv.serving.router.store_view import StoreView
from hybridkv.store.keys import KeySpace

FINGERPRINT = bytes(range(16))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis(port: int) -> subprocess.Popen:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def store_docs(port: int, layout: CacheLayout, docs: list[list[int]]) -> int:
    """Put every group's block keys of each document; how many keys."""
    import redis

    client = redis.Redis(port=port)
    space = KeySpace(FINGERPRINT, len(layout.specs))
    hbs = layout.hash_block_size
    pipe, count = client.pipeline(transaction=False), 0
    for doc in docs:
        hashes = compute_block_hashes(doc, hbs)
        for g, spec in enumerate(layout.specs):
            stride = spec.block_size // hbs
            for key in space.keys(g, hashes[stride - 1::stride]):
                pipe.set(b"hkv:" + key, b"x")
                count += 1
    pipe.execute()
    return count


def summary(values: list[float]) -> dict:
    values = sorted(values)
    return {"median_us": round(statistics.median(values), 1),
            "p90_us": round(values[int(0.9 * (len(values) - 1))], 1)}


async def measure(args, router: Router, view: StoreView, docs, rng) -> dict:
    out = {}
    for kind in ("hit", "miss"):
        query, decide = [], []
        for _ in range(args.queries):
            doc = rng.choice(docs) if kind == "hit" else tokens(rng, args.doc_len)
            prompt = doc + tokens(rng, 48)
            hashes = PromptHashes(prompt)
            t0 = time.perf_counter()
            stored = await view.stored(hashes)
            t1 = time.perf_counter()
            router.finished(router.route(prompt, hashes=hashes, stored=stored))
            t2 = time.perf_counter()
            query.append((t1 - t0) * 1e6)
            decide.append((t2 - t1) * 1e6)
        out[kind] = {"store_query": summary(query), "route_with_answer": summary(decide)}
    return out


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 32000) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-27b")
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--docs", type=int, default=200)
    ap.add_argument("--doc-len", type=int, default=2048)
    ap.add_argument("--queries", type=int, default=200)
    add_common_args(ap)
    args = ap.parse_args()
    prepare_out(args.out)
    if args.quick:
        args.instances, args.docs, args.queries = 4, 5, 10
    config = KVCacheConfig.from_layer_specs(model_layout(args.model, 16), 2**34)
    layout = CacheLayout.from_config(config)
    rng = random.Random(0)
    docs = [tokens(rng, args.doc_len) for _ in range(args.docs)]
    port = free_port()
    proc = start_redis(port)
    try:
        keys = store_docs(port, layout, docs)
        router = Router("hybrid-prefix")
        url = f"redis://127.0.0.1:{port}/0"
        view = StoreView(url, router)
        bound = {"kv_store": {"url": url, "prefix": "hkv", "fingerprint": FINGERPRINT.hex()}}
        for k in range(args.instances):
            router.add_backend(f"i{k}", layout)
            view.bind(f"i{k}", bound)

        async def run() -> dict:
            try:
                await view.stored(PromptHashes(docs[0]))  # connect and load the script
                return await measure(args, router, view, docs, rng)
            finally:
                await view.close()

        result = asyncio.run(run())
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"{args.model}: {len(layout.specs)} groups, {args.instances} instances bound, "
          f"{keys:,} keys stored, {args.doc_len}+48-token prompts")
    for kind, row in result.items():
        print(f"  {kind:5s} store query {row['store_query']['median_us']:7.0f} us "
              f"(p90 {row['store_query']['p90_us']:.0f})  route with its answer "
              f"{row['route_with_answer']['median_us']:6.1f} us "
              f"(p90 {row['route_with_answer']['p90_us']:.1f})")
    print("wrote", write_result("store_view", {"config": vars(args), "keys": keys,
                                               "results": result}, args.out))


if __name__ == "__main__":
    main()
