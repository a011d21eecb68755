"""The KV tier without a model: hits through pool + store against brute force, and
the data every hit block holds against what the request's tokens say it must."""

import random
import warnings

import pytest

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from hybridkv.store import CpuStore, StoreError
from hybridkv.testing.oracles import cached_positions, hybrid_longest_reusable, oracle_for
from tests.store.sim import SimEngine

# tiny pools on purpose: the manager's hint that the pool is too small is expected
pytestmark = pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")

CONFIGS = {
    "full": [FullAttentionSpec(4)],
    "full+swa": [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=10)],
    "full+mamba": [FullAttentionSpec(4), MambaSpec(4)],
    "full+chunked": [FullAttentionSpec(4), ChunkedLocalAttentionSpec(4, attention_chunk_size=16)],
    "all four": [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=7),
                 ChunkedLocalAttentionSpec(4, attention_chunk_size=8),
                 MambaSpec(4, checkpoint_interval=3)],
    "mixed block sizes": [FullAttentionSpec(4), SlidingWindowSpec(8, sliding_window=12),
                          MambaSpec(8)],
    "swa+sinks+mamba": [SlidingWindowSpec(4, sliding_window=9, num_sink_tokens=4),
                        MambaSpec(4)],
}


def workload(rng, num_docs=4, num_requests=40, vocab=50):
    docs = [[rng.randrange(vocab) for _ in range(rng.randrange(20, 70))] for _ in range(num_docs)]
    prompts = []
    for _ in range(num_requests):
        doc = rng.choice(docs)
        cut = rng.randrange(len(doc) // 2, len(doc) + 1)
        prompts.append(doc[:cut] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))])
    return prompts


def held_positions(eng, prompt):
    """Per group: block positions of `prompt` in the pool, the store or the writer's backlog."""
    kv, tier, store = eng.kv, eng.tier, eng.tier.store
    hashes = Request("probe", prompt).block_hashes(kv.hash_algo, kv.hash_block_size)
    out = []
    for g, spec in enumerate(kv.config.specs):
        stride = spec.block_size // kv.hash_block_size
        held = set(cached_positions(kv.pool, g, hashes, stride))
        for p in range(len(hashes) // stride):
            block_hash = hashes[(p + 1) * stride - 1]
            if store.contains([tier.keys.key(g, block_hash)])[0] \
                    or tier.writer.has(g, block_hash):
                held.add(p)
        out.append(held)
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("select, store_bytes", [("hybrid", 1 << 24), ("all", 1 << 24),
                                                 ("hybrid", 12_000)])
def test_hits_through_the_store_match_brute_force(name, select, store_bytes):
    """Every admission: the hit equals the brute-force hybrid answer over the blocks
    in the pool or the store (a small store evicts too), and every hit block holds
    the request's own data."""
    specs = CONFIGS[name]
    rng = random.Random(hash(name) % 1000)
    eng = SimEngine(specs, num_blocks=30 * len(specs), store=CpuStore(store_bytes),
                    select=select)
    total_external = 0
    for prompt in workload(rng):
        eng.tier.flush()  # the store holds still while the expectation is computed
        rules = [(oracle_for(s), s, held) for s, held in zip(specs, held_positions(eng, prompt))]
        expected = hybrid_longest_reusable(rules, len(prompt) - 1)
        hit, external = eng.run(prompt)
        assert hit == expected
        total_external += external
    eng.tier.flush()
    stats = eng.tier.stats()
    assert total_external > 0 and stats.hit_tokens == total_external
    assert (stats.store.evicted_keys > 0) == (store_bytes < 1 << 20)
    assert stats.loaded_blocks > 0 and stats.written_blocks > 0 and stats.rejected_blocks == 0
    assert eng.checked_blocks > 0


@pytest.mark.parametrize("name", ["full+swa", "full+mamba", "all four"])
def test_a_store_never_lowers_what_is_reused_here(name):
    """The same sequence with and without a store: every evicted document asked
    again is at least as reusable with one (no eviction in the store)."""
    specs = CONFIGS[name]
    prompts = workload(random.Random(3), num_docs=6, num_requests=60)
    plain = SimEngine(specs, num_blocks=25 * len(specs))
    tiered = SimEngine(specs, num_blocks=25 * len(specs), store=CpuStore(1 << 24))
    plain_hits = [plain.run(p)[0] for p in prompts]
    tiered_runs = [tiered.run(p) for p in prompts]
    assert sum(h for h, _ in tiered_runs) > sum(plain_hits)
    assert sum(e for _, e in tiered_runs) > 0


def test_hybrid_selection_stores_fewer_window_blocks_than_all():
    """Windows far before every stop (more than 256 tokens before the prompt end)
    are rated low value and left out; full-attention blocks are all kept."""
    specs = [FullAttentionSpec(16), SlidingWindowSpec(16, sliding_window=32)]
    rng = random.Random(5)
    docs = [[rng.randrange(50) for _ in range(700)] for _ in range(3)]
    prompts = [rng.choice(docs) + [rng.randrange(50) for _ in range(20)] for _ in range(12)]
    written = {}
    for select in ("hybrid", "all"):
        eng = SimEngine(specs, num_blocks=110, store=CpuStore(1 << 24), select=select)
        for p in prompts:
            eng.run(p)
        eng.tier.flush()
        groups = eng.tier.stats().groups
        written[select] = (groups[0].written_blocks, groups[1].written_blocks)
    assert written["hybrid"][0] == written["all"][0]  # full attention: every evicted block
    assert written["hybrid"][1] < written["all"][1]


def test_damaged_values_are_rejected_once_warned_and_recomputed():
    specs = CONFIGS["full+swa"]
    store = CpuStore(1 << 24)
    eng = SimEngine(specs, num_blocks=50, store=store)
    doc = list(range(3, 63))
    eng.run(doc + [1])
    for i in range(8):  # push the document out of the pool
        eng.run([40 + i] * 50)
    eng.tier.flush()
    for key in store.keys():
        value = bytearray(store.get([key])[0])
        value[-1] ^= 1
        store.put([key], [bytes(value)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hit, external = eng.run(doc + [2])  # check_hit inside: no damaged data reaches a hit
        eng.run(doc + [2])
    assert external == 0
    assert eng.tier.stats().rejected_blocks > 0
    assert sum("rejected a stored block" in str(w.message) for w in caught) == 1


class FlakyStore(CpuStore):
    """A cpu store whose calls raise StoreError while `down`."""

    def __init__(self, capacity):
        super().__init__(capacity)
        self.down = False

    def _check(self):
        if self.down:
            raise StoreError("connection refused")

    def put(self, keys, values):
        self._check()
        return super().put(keys, values)

    def get(self, keys):
        self._check()
        return super().get(keys)

    def contains(self, keys):
        self._check()
        return super().contains(keys)

    def prefix_length(self, keys):
        self._check()
        return super().prefix_length(keys)


def test_a_failing_store_costs_hits_and_one_warning_never_an_error():
    specs = CONFIGS["all four"]
    store = FlakyStore(1 << 24)
    eng = SimEngine(specs, num_blocks=30 * len(specs), store=store)
    eng.tier.guard.first_delay = eng.tier.guard.max_delay = 0.0  # retry at once
    prompts = workload(random.Random(9), num_requests=60)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, prompt in enumerate(prompts):
            store.down = 20 <= i < 40
            eng.run(prompt)
            eng.tier.flush()
    stats = eng.tier.stats()
    assert stats.errors > 0 and stats.hit_tokens > 0
    assert sum("failed" in str(w.message) for w in caught) == 1


def test_write_through_lets_a_second_engine_reuse_what_the_first_computed():
    specs = CONFIGS["all four"]
    store = CpuStore(1 << 24)
    first = SimEngine(specs, num_blocks=80, store=store, write_through=True)
    doc = list(range(5, 70))
    first.run(doc + [1, 2])
    first.tier.flush()
    assert first.kv.prefix_cache_stats.evictions == 0  # nothing was evicted: written when computed
    second = SimEngine(specs, num_blocks=80, store=store)
    hit, external = second.run(doc + [3, 4])
    assert hit == external and hit >= len(doc) // 8 * 8 and second.checked_blocks > 0


def test_a_hit_joins_pool_and_store_blocks_in_any_order():
    """Full-attention block 3 and the window (blocks 8-9) only in the store, the rest
    only in the pool: the hit runs through all ten blocks, the three loaded with the
    request's own data."""
    from hybridkv.store import encode_block
    from tests.store.sim import content

    store = CpuStore(1 << 24)
    eng = SimEngine([FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=8)],
                    num_blocks=60, store=store)
    doc = list(range(5, 45))
    eng.run(doc + [1])
    hashes = Request("probe", doc).block_hashes(eng.kv.hash_algo, eng.kv.hash_block_size)
    for g, i in ((0, 3), (1, 8), (1, 9)):  # move these blocks from the pool to the store
        key = eng.tier.keys.key(g, hashes[i])
        value = encode_block(eng.tier.layouts[g], key, content(g, doc[:(i + 1) * 4]))
        store.put([key], [value])
        eng.kv.evict_blocks([eng.kv.pool.get_cached_block(hashes[i], g).block_id])
    hit, external = eng.run(doc + [2])
    assert (hit, external) == (40, 40 - 12) and eng.tier.stats().loaded_blocks == 3
