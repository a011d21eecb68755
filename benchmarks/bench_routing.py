"""Cost of one routing decision at 64 instances holding about 1M cached blocks.

Each instance is a real KVCacheManager (a real model's group layout,
`--model`) whose block events feed the router's index. Instances serve
documents drawn from a shared corpus (Zipf popularity, so popular documents
sit on many instances) plus a unique question, until their pools are full
and evicting. Then `Router.route` (hash the prompt, look it up for every
instance, pick one by the `hybrid-prefix` policy) is timed on prompts that
hit cached documents, partly match them, or miss everywhere; the prompt
hashing and the index lookup are also timed alone.

    python benchmarks/bench_routing.py --model gemma-3-27b
    python benchmarks/bench_routing.py --model jamba-1.5-mini --doc-len 8192

The result JSON goes to `--out DIR` (default ./hybridkv-bench-output) as routing.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any, NamedTuple

from common import add_common_args, prepare_out, write_result

from hybridkv.kv_cache.hashing import compute_block_hashes
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.models.layouts import model_layout
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.routing import Router


def model_specs(model: str, block_size: int) -> list:
    """The model's groups as `from_layer_specs` forms them (the budget only sizes the pool)."""
    config = KVCacheConfig.from_layer_specs(model_layout(model, block_size), 2**34)
    return [g.kv_cache_spec for g in config.kv_cache_groups]


class Filler:
    """One instance: a real manager serving whole prompts one at a time, its block
    events handed to the router (`deliver`) after each."""

    def __init__(self, name: str, specs: list, num_blocks: int, router: Router) -> None:
        config = KVCacheConfig(num_blocks, [KVCacheGroupSpec([f"g{i}"], s)
                                            for i, s in enumerate(specs)])
        self.kv = KVCacheManager(config)
        self.name = name
        self.events: list = []
        self.kv.pool.subscribe(self.events.append)
        self.router = router
        self.count = 0
        self.register(config)

    def register(self, config: KVCacheConfig) -> None:
        self.router.add_backend(self.name, CacheLayout.from_config(config))

    def note_request(self, req: Request) -> None:
        """A request about to be looked up (what its events will be keyed by)."""

    def deliver(self) -> None:
        self.router.apply_events(self.name, self.events)

    def serve(self, prompt: list[int]) -> None:
        self.count += 1
        req = Request(f"{self.name}-{self.count}", prompt)
        self.note_request(req)
        blocks, hit = self.kv.get_computed_blocks(req)
        got = self.kv.allocate_slots(req, len(prompt) - hit, hit, blocks if hit else None)
        assert got is not None, "the pool cannot hold one prompt"
        req.num_computed_tokens = len(prompt)
        self.kv.free(req)
        self.deliver()
        self.events.clear()


def fill(args, router: Router, corpus: list[list[int]], rng: random.Random,
         filler_type: type[Filler] = Filler) -> list[Filler]:
    specs = model_specs(args.model, args.block_size)
    per_instance = args.total_blocks // args.instances
    fillers = [filler_type(f"i{k}", specs, per_instance, router) for k in range(args.instances)]
    weights = [1 / (r + 1) ** args.zipf for r in range(len(corpus))]
    for filler in fillers:
        while filler.kv.pool.num_evictions < per_instance // 4:  # full, and evicting
            doc = rng.choices(corpus, weights)[0]
            filler.serve(doc + question(rng, args.vocab))
    return fillers


def question(rng: random.Random, vocab: int, n: int = 48) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def queries(args, corpus, rng) -> list[tuple[str, list[int]]]:
    out = []
    for i in range(args.queries):
        kind = ("hit", "partial", "miss")[i % 3]
        doc = rng.choice(corpus[:64])
        if kind == "partial":
            doc = doc[:rng.randrange(args.block_size, len(doc))]
        elif kind == "miss":
            doc = question(rng, args.vocab, len(doc))
        out.append((kind, doc + question(rng, args.vocab)))
    return out


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def summary(values: list[float]) -> dict:
    values = sorted(values)
    return {"median_us": round(statistics.median(values), 1),
            "p90_us": round(values[int(0.9 * (len(values) - 1))], 1),
            "max_us": round(values[-1], 1)}


def measure(args, router: Router, fillers, corpus, rng) -> dict:
    index = next(iter(router.indexes.values()))
    rows: dict[str, dict[str, list[float]]] = {}
    for kind, prompt in queries(args, corpus, rng):
        hashes = compute_block_hashes(prompt, index.hash_block_size)
        row = rows.setdefault(kind, {"hash": [], "lookup": [], "route": [], "reuse": []})
        row["hash"].append(timed(lambda p=prompt: compute_block_hashes(p, index.hash_block_size),
                                 args.repeats))
        row["lookup"].append(timed(lambda h=hashes, p=prompt: index.lookup(h, len(p) - 1),
                                   args.repeats))
        row["route"].append(timed(lambda p=prompt: router.finished(router.route(p)),
                                  args.repeats))
        reuse = index.lookup(hashes, len(prompt) - 1).per_slot(len(index.slots))
        row["reuse"].append(sum(1 for r in reuse if r))
    out = {}
    for kind, row in rows.items():
        out[kind] = {part: summary(row[part]) for part in ("hash", "lookup", "route")}
        out[kind]["instances_with_reuse_mean"] = round(statistics.mean(row["reuse"]), 1)
    return out


def parse_args(description: str) -> argparse.Namespace:
    """The options every routing-decision benchmark takes (`--quick` shrinks them)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="gemma-3-27b")
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--total-blocks", type=int, default=1_000_000)
    parser.add_argument("--doc-len", type=int, default=2048)
    parser.add_argument("--num-docs", type=int, default=2000)
    parser.add_argument("--zipf", type=float, default=0.8)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5, help="best of N per query")
    add_common_args(parser)
    args = parser.parse_args()
    prepare_out(args.out)
    if args.quick:
        args.instances, args.total_blocks, args.num_docs, args.queries = 4, 20_000, 50, 9
    return args


class Fleet(NamedTuple):
    """Instances filled from a Zipf-popular corpus, and the router's index of them."""

    rng: random.Random
    corpus: list[list[int]]
    router: Router
    fillers: list
    index: Any
    cached_blocks: int
    fill_s: float


def filled_fleet(args: argparse.Namespace, filler_type: type[Filler] = Filler) -> Fleet:
    """The corpus, a `hybrid-prefix` router and its instances (`filler_type`) filled,
    timed, with the group blocks the router's index then holds."""
    rng = random.Random(0)
    corpus = [question(rng, args.vocab, args.doc_len) for _ in range(args.num_docs)]
    router = Router("hybrid-prefix")
    t0 = time.perf_counter()
    fillers = fill(args, router, corpus, rng, filler_type)
    fill_s = time.perf_counter() - t0
    index = next(iter(router.indexes.values()))
    cached = sum(index.num_cached_blocks(f.name) for f in fillers)
    return Fleet(rng, corpus, router, fillers, index, cached, fill_s)


def print_rows(result: dict) -> None:
    """One line per prompt kind: hashing, lookup and whole-route time."""
    for kind, row in result.items():
        print(f"  {kind:8s} hash {row['hash']['median_us']:7.1f} us  lookup "
              f"{row['lookup']['median_us']:7.1f} us (p90 {row['lookup']['p90_us']:.1f})  "
              f"route {row['route']['median_us']:7.1f} us (p90 {row['route']['p90_us']:.1f}, "
              f"max {row['route']['max_us']:.1f})  instances reusing "
              f"{row['instances_with_reuse_mean']}")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rng, corpus, router, fillers, index, cached, fill_s = filled_fleet(args)
    print(f"{args.model}: {args.instances} instances, {len(index.classes)} reuse classes, "
          f"{cached:,} cached group blocks in the index (filled in {fill_s:.0f} s)")
    result = measure(args, router, fillers, corpus, rng)
    print_rows(result)
    path = write_result("routing", {"config": vars(args), "cached_blocks": cached,
                                    "results": result}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
