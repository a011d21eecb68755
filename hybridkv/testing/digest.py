"""Replay digests: one hash of everything a KV cache manager decided on a set of workloads.

A speed-only change must leave every decision as it was: the same block ids
handed out in the same order, the same hits, the same stats, events,
evictions and free-queue order. `run_digests` replays fixed workloads and
hashes all of it per scenario:

- `shared/...`: the scheduler-path trace (`shared_prefix_trace`) on the full,
  swa and mamba configs, with a roomy pool and a small one (evictions,
  preemptions);
- `pressure/...`: the pressure settings (`hybridkv.tools.pressure`, small
  traces of the same shapes);
- `random/...`: seeded random traffic on every group mix of the fuzz configs
  (sinks, chunked attention, Mamba intervals, mixed block sizes), with
  salts, LoRA names, chunked prefills, preemptions, explicit evictions and
  prefix-cache resets.

each under the `lru` and `hybrid` policies. Recorded per call: the hit (block
ids per group, tokens), the blocks an allocation returned (or None, or the
error), the request's block ids and retained block ids after it; at the end
the prefix-cache stats, the free queue in eviction order and the hash map;
in scenarios with listeners, every event and evicted or stale block.

    python -m hybridkv.testing.digest [--quick] [--only PREFIX]

prints one JSON object: scenario -> digest (16 hex digits), and `all`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import warnings
from collections.abc import Callable, Iterator
from functools import partial

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.testing.fuzz import CONFIGS
from hybridkv.tools.bench_traces import reuse_stats, shared_prefix_trace
from hybridkv.tools.pressure import SETTINGS, pool_blocks
from hybridkv.tools.replay import ManagerAdapter, make_config, replay

POLICIES = ("lru", "hybrid")


class Recorder:
    """Collects what a manager decided, as reprs fed to one sha256."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.count = 0

    def add(self, *item: object) -> None:
        self._hash.update(repr(item).encode())
        self._hash.update(b"\n")
        self.count += 1

    def listen(self, manager: KVCacheManager) -> None:
        """Record events, evicted blocks and stale blocks as they happen."""
        manager.subscribe(lambda event: self.add("event", repr(event)))
        manager.on_evict(lambda blocks: self.add("evict", [(b.block_id, b.block_hash)
                                                           for b in blocks]))
        manager.on_stale_blocks(lambda ids: self.add("stale", list(ids)))

    def final_state(self, manager: KVCacheManager) -> None:
        manager.check_integrity()
        stats = dataclasses.asdict(manager.prefix_cache_stats)
        pool = manager.pool
        self.add("stats", sorted(stats.items()), manager.num_free_blocks)
        self.add("free queue", [b.block_id for b in pool.free_queue])
        self.add("cached", [sorted((h, b.block_id) for h, b in table.items())
                            for table in pool.cached])
        self.add("blocks", [(b.ref_cnt, b.num_hits, int(b.value_hint)) for b in pool.blocks])

    def hexdigest(self) -> str:
        return self._hash.hexdigest()[:16]


def _ids(blocks) -> list[list[int]] | None:
    return None if blocks is None else [[b.block_id for b in g] for g in blocks.blocks]


class RecordingAdapter(ManagerAdapter):
    """The replay driver's adapter, recording every decision of the manager."""

    def __init__(self, config: KVCacheConfig, policy: str, recorder: Recorder) -> None:
        super().__init__(config, eviction_policy=policy)
        self.rec = recorder

    def lookup(self, req: Request) -> int:
        num_cached = super().lookup(req)
        self.rec.add("lookup", req.request_id, num_cached, _ids(self._hits[req.request_id][0]))
        return num_cached

    def allocate(self, req: Request, num_tokens: int) -> bool:
        blocks, num_cached = self._hits.pop(req.request_id, (None, 0))
        out = self.manager.allocate_slots(req, num_tokens, num_cached, blocks)
        self.rec.add("allocate", req.request_id, num_tokens, num_cached, _ids(out))
        if out is None:
            return False
        req.num_computed_tokens += num_cached + num_tokens
        self.rec.add("held", self.manager.get_block_ids(req.request_id),
                     self.manager.get_retained_block_ids(req.request_id))
        return True

    def free(self, req: Request) -> None:
        super().free(req)
        self.rec.add("free", req.request_id, self.manager.num_free_blocks)

    def preempt(self, req: Request) -> None:
        super().preempt(req)
        self.rec.add("preempt", req.request_id, self.manager.num_free_blocks)


def _replay_digest(trace, config: KVCacheConfig, policy: str, max_running: int,
                   listen: bool) -> str:
    rec = Recorder()
    adapter = RecordingAdapter(config, policy, rec)
    if listen:
        rec.listen(adapter.manager)
    res = replay(trace, adapter, max_running=max_running, max_batched_tokens=8192)
    rec.add("replay", res.finished, res.preemptions, res.hit_tokens, res.prompt_tokens)
    rec.final_state(adapter.manager)
    return rec.hexdigest()


def shared_scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], str]]]:
    trace = shared_prefix_trace(num_requests=100 if quick else 300,
                                unique_len=256, decode_steps=40 if quick else 64)
    for config in ("full", "swa", "mamba"):
        for num_blocks in (4096, 900):
            for policy in POLICIES:
                name = f"shared/{config}/{num_blocks}/{policy}"
                yield name, partial(_replay_digest, trace, make_config(config, num_blocks),
                                    policy, 64, num_blocks < 4096)


def pressure_scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], str]]]:
    for setting in SETTINGS.values():
        trace = setting.trace(quick=True)
        stats = reuse_stats(trace)
        for config in ("full", "swa", "mamba"):
            num_blocks = pool_blocks(stats, setting.pool_fraction, config)
            for policy in POLICIES:
                yield (f"pressure/{setting.name}/{config}/{policy}",
                       partial(_replay_digest, trace, make_config(config, num_blocks), policy,
                               setting.max_running, True))


def random_scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], str]]]:
    seeds = (0,) if quick else (0, 1, 2)
    for mix, specs in CONFIGS.items():
        groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]
        for policy in POLICIES:
            for seed in seeds:
                yield (f"random/{mix}/{policy}/{seed}",
                       partial(_random_digest, groups, policy, seed, 150 if quick else 400))


def _random_digest(groups: list[KVCacheGroupSpec], policy: str, seed: int, steps: int) -> str:
    rec = Recorder()
    RandomTraffic(groups, policy, seed, rec).run(steps)
    return rec.hexdigest()


REFUSED = object()  # an allocation the pool could never supply


class RandomTraffic:
    """Seeded random scheduler actions on a small pool (see the module docstring)."""

    VOCAB = 5

    def __init__(self, groups: list[KVCacheGroupSpec], policy: str, seed: int,
                 rec: Recorder) -> None:
        self.rng = random.Random(seed)
        self.rec = rec
        block = max(g.kv_cache_spec.block_size for g in groups)
        num_blocks = self.rng.choice((8, 14, 24)) * len(groups) + 2 * block
        self.kv = KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy=policy,
                                 hash_algo=self.rng.choice(("sha256", "xxhash")),
                                 warn_repeated_misses=False)
        if seed % 2 == 0:
            rec.listen(self.kv)
        self.bases = [[self.rng.randrange(self.VOCAB) for _ in range(80)] for _ in range(3)]
        self.waiting: list[tuple[Request, int]] = []  # (request, output tokens left)
        self.running: dict[str, list] = {}  # id -> [request, output left, hit pending]
        self.next_id = 0

    def run(self, steps: int) -> None:
        actions = (self.new, self.admit, self.advance, self.advance, self.advance,
                   self.finish, self.preempt, self.evict, self.reset)
        weights = (4, 4, 8, 8, 8, 5, 1, 1, 1)
        for _ in range(steps):
            self.rng.choices(actions, weights)[0]()
        for rid in list(self.running):
            self._free(rid, "free")
        self.rec.final_state(self.kv)

    def new(self) -> None:
        rng = self.rng
        base = rng.choice(self.bases)
        prompt = base[:rng.randrange(1, 60)] + [rng.randrange(self.VOCAB)
                                               for _ in range(rng.randrange(0, 12))]
        salt = rng.choice((None, None, "s1"))
        lora = rng.choice((None, None, None, "l1"))
        req = Request(f"r{self.next_id}", prompt, cache_salt=salt, lora_name=lora)
        self.next_id += 1
        self.waiting.append((req, rng.randrange(0, 24)))

    def admit(self) -> None:
        if not self.waiting:
            return
        req, out = self.waiting[0]
        blocks, hit = self.kv.get_computed_blocks(req)
        self.rec.add("lookup", req.request_id, hit, _ids(blocks))
        n = min(req.num_tokens - hit, self.rng.randrange(1, 40))
        new = self._allocate(req, n, hit, blocks if hit else None)
        if new is REFUSED:
            self.waiting.pop(0)  # it can never run: the scheduler drops it
        elif new is not None:
            self.waiting.pop(0)
            req.num_computed_tokens += hit + n
            self.running[req.request_id] = [req, out]

    def advance(self) -> None:
        if not self.running:
            return
        entry = self.running[self.rng.choice(list(self.running))]
        req = entry[0]
        if req.num_computed_tokens == req.num_tokens:
            if not entry[1]:
                return
            entry[1] -= 1
            token = self.rng.randrange(self.VOCAB)
            req.append_output_token_ids(self.rng.choice((token, [token])))
        n = min(req.num_tokens - req.num_computed_tokens, self.rng.randrange(1, 20))
        if self.rng.random() < 0.05:
            n = 0
        new = self._allocate(req, n, 0, None)
        if new is REFUSED:
            self._free(req.request_id, "abort")
        elif new is not None:
            req.num_computed_tokens += n

    def _allocate(self, req: Request, n: int, hit: int, blocks):
        try:
            out = self.kv.allocate_slots(req, n, hit, blocks)
        except ValueError as error:
            self.rec.add("refused", req.request_id, str(error))
            return REFUSED
        self.rec.add("allocate", req.request_id, n, hit, _ids(out))
        if out is not None:
            self.rec.add("held", self.kv.get_block_ids(req.request_id),
                         self.kv.get_retained_block_ids(req.request_id))
        elif self.running and self.rng.random() < 0.7:
            self.preempt()
        return out

    def finish(self) -> None:
        done = [rid for rid, (req, out) in self.running.items()
                if not out and req.num_computed_tokens == req.num_tokens]
        if done:
            self._free(self.rng.choice(done), "free")

    def preempt(self) -> None:
        if self.running:
            rid = list(self.running)[-1]
            req, out = self.running[rid]
            self._free(rid, "preempt")
            req.num_computed_tokens = 0
            self.waiting.insert(0, (req, out))

    def _free(self, rid: str, what: str) -> None:
        req = self.running.pop(rid)[0]
        self.kv.free(req)
        self.rec.add(what, rid, self.kv.num_free_blocks)

    def evict(self) -> None:
        ids = self.rng.sample(range(self.kv.pool.num_blocks), 2)
        self.kv.evict_blocks(ids)
        self.rec.add("evict_blocks", ids)

    def reset(self) -> None:
        if self.rng.random() < 0.3:
            self.rec.add("reset", self.kv.reset_prefix_cache())


SCENARIOS = {"shared": shared_scenarios, "pressure": pressure_scenarios,
             "random": random_scenarios}


def run_digests(quick: bool = False, only: str = "") -> dict[str, str]:
    """scenario name -> digest, and `all` over every one of them."""
    out: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for scenarios in SCENARIOS.values():
            for name, compute in scenarios(quick):
                if name.startswith(only):
                    out[name] = compute()
    whole = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]
    return {**out, "all": whole}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller workloads (seconds)")
    ap.add_argument("--only", default="", help="scenarios whose name starts with this")
    args = ap.parse_args(argv)
    print(json.dumps(run_digests(args.quick, args.only), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
