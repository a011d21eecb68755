"""Cost of one routing decision when every instance's index is learned from
vLLM-format KV events (64 instances, about 1M cached blocks).

The set-up of `bench_routing.py` (real managers of a real model's layout,
Zipf documents until the pools evict), except that each instance's block
events take the path a vLLM backend's take: converted to `KVEventBatch`es
(tokens, parent hashes, group kinds: `zmq_publisher`), encoded to msgpack
bytes, decoded, and applied by a `VllmCacheView` (the router's own chain
over the tokens, groups and rules learned from the events). Then
`Router.route` is timed as there (hashing the prompt included in `route`;
`lookup` alone excludes it), and the event ingestion rate is reported.

    python benchmarks/bench_routing_vllm.py --model gemma-3-27b --out /tmp/bench-routing-vllm
"""

from __future__ import annotations

import random
import time

from bench_routing import filled_fleet, measure, model_specs, parse_args, print_rows, question
from common import write_result

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.serving.kv_events_wire import WireBatch, decode_batch, encode_batch
from hybridkv.serving.router.routing import Router
from hybridkv.serving.router.vllm_view import VllmCacheView
from hybridkv.serving.zmq_publisher import KvEventsConfig, ZmqKvEventPublisher


class VllmFiller:
    """One instance whose events reach the router as vLLM's would."""

    def __init__(self, name: str, specs: list, num_blocks: int, router: Router) -> None:
        config = KVCacheConfig(num_blocks, [KVCacheGroupSpec([f"g{i}"], s)
                                            for i, s in enumerate(specs)])
        self.kv = KVCacheManager(config)
        self.name = name
        self.events: list = []
        self.kv.pool.subscribe(self.events.append)
        self.publisher = ZmqKvEventPublisher(KvEventsConfig(True, "zmq"), self.kv)
        self.view = VllmCacheView(name, router)
        self.count = 0
        self.ingest_s = 0.0
        self.num_events = 0

    def serve(self, prompt: list[int]) -> None:
        self.count += 1
        req = Request(f"{self.name}-{self.count}", prompt)
        self.publisher.note_request(req)
        blocks, hit = self.kv.get_computed_blocks(req)
        got = self.kv.allocate_slots(req, len(prompt) - hit, hit, blocks if hit else None)
        assert got is not None, "the pool cannot hold one prompt"
        req.num_computed_tokens = len(prompt)
        self.kv.free(req)
        t0 = time.perf_counter()
        payload = encode_batch(WireBatch(0.0, self.publisher.convert(self.events)))
        self.view.apply(decode_batch(payload))
        self.ingest_s += time.perf_counter() - t0
        self.num_events += len(self.events)
        self.events.clear()


def fill(args, router: Router, corpus, rng: random.Random) -> list[VllmFiller]:
    specs = model_specs(args.model, args.block_size)
    per_instance = args.total_blocks // args.instances
    fillers = [VllmFiller(f"i{k}", specs, per_instance, router) for k in range(args.instances)]
    weights = [1 / (r + 1) ** args.zipf for r in range(len(corpus))]
    for filler in fillers:
        while filler.kv.pool.num_evictions < per_instance // 4:  # full, and evicting
            doc = rng.choices(corpus, weights)[0]
            filler.serve(doc + question(rng, args.vocab))
    return fillers


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rng, corpus, router, fillers, index, cached, fill_s = filled_fleet(args, fill)
    events = sum(f.num_events for f in fillers)
    ingest = sum(f.ingest_s for f in fillers)
    unplaced = sum(f.view.num_unplaced for f in fillers)
    print(f"{args.model}: {args.instances} instances, {len(index.classes)} reuse classes, "
          f"{cached:,} cached group blocks (filled in {fill_s:.0f} s; {events:,} block events "
          f"ingested at {ingest / max(events, 1) * 1e6:.1f} us each, {unplaced} unplaced)")
    result = measure(args, router, fillers, corpus, rng)
    print_rows(result)
    path = write_result("routing_vllm", {
        "config": vars(args), "cached_blocks": cached, "block_events": events,
        "ingest_us_per_event": ingest / max(events, 1) * 1e6, "unplaced": unplaced,
        "results": result}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
