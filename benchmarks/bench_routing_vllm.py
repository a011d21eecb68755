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

import time

from bench_routing import Filler, filled_fleet, measure, parse_args, print_rows
from common import write_result

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.request import Request
from hybridkv.serving.kv_events_wire import WireBatch, decode_batch, encode_batch
from hybridkv.serving.router.vllm_view import VllmCacheView
from hybridkv.serving.zmq_publisher import KvEventsConfig, ZmqKvEventPublisher


class VllmFiller(Filler):
    """One instance whose events reach the router as vLLM's would: converted to vLLM's
    wire format, encoded, decoded and applied by a `VllmCacheView` (timed)."""

    def register(self, config: KVCacheConfig) -> None:
        self.publisher = ZmqKvEventPublisher(KvEventsConfig(True, "zmq"), self.kv)
        self.view = VllmCacheView(self.name, self.router)
        self.ingest_s = 0.0
        self.num_events = 0

    def note_request(self, req: Request) -> None:
        self.publisher.note_request(req)

    def deliver(self) -> None:
        t0 = time.perf_counter()
        payload = encode_batch(WireBatch(0.0, self.publisher.convert(self.events)))
        self.view.apply(decode_batch(payload))
        self.ingest_s += time.perf_counter() - t0
        self.num_events += len(self.events)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rng, corpus, router, fillers, index, cached, fill_s = filled_fleet(args, VllmFiller)
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
