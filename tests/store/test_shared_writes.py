"""Compute-time writes for shared stores, without a model: the blocks chosen at a
stop against the reuse rules' brute force, and a second instance on the same
store reusing what the first holds, with every hit block's data checked."""

import random

import pytest

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from hybridkv.store import CpuStore
from hybridkv.store.shared_writes import needed_blocks, stop_lengths
from hybridkv.testing.oracles import oracle_for, required_positions
from tests.store.sim import SimEngine

pytestmark = pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")

SPECS = [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=7),
         SlidingWindowSpec(4, sliding_window=13, num_sink_tokens=5),
         ChunkedLocalAttentionSpec(4, attention_chunk_size=12), MambaSpec(4),
         SlidingWindowSpec(8, sliding_window=20)]

CONFIGS = {
    "full+swa": [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=10)],
    "full+mamba": [FullAttentionSpec(4), MambaSpec(4)],
    "all four": [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=7),
                 ChunkedLocalAttentionSpec(4, attention_chunk_size=8),
                 MambaSpec(4, checkpoint_interval=3)],
    "swa+sinks+mamba": [SlidingWindowSpec(4, sliding_window=9, num_sink_tokens=4),
                        MambaSpec(4)],
}


def managers(specs):
    groups = [KVCacheGroupSpec([f"layer{g}"], s) for g, s in enumerate(specs)]
    return KVCacheManager(KVCacheConfig(64, groups)).coordinator.managers


@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_the_blocks_chosen_at_a_stop_are_what_the_reuse_rule_needs(spec):
    (m,) = managers([spec])
    oracle = oracle_for(spec)
    b = spec.block_size
    for length in range(b, 30 * b, b):
        prompt = length + random.Random(length).randrange(b)  # the stop: the prompt's end
        if m.downward_closed:
            assert needed_blocks(m, prompt, [length]) == list(range(prompt // b))
        else:
            assert set(needed_blocks(m, prompt, [length])) == \
                required_positions(oracle, spec, length), length


def test_stops_cover_the_prompts_tail_and_the_junction():
    assert stop_lengths(40, 16, 8, tail_tokens=16) == [16, 24, 32, 40]
    assert stop_lengths(1000, 96, 16, tail_tokens=256) == \
        [96] + list(range(752, 993, 16))
    assert stop_lengths(10, 0, 16) == []  # shorter than one aligned block


def workload(rng, num_docs=3, vocab=50):
    docs = [[rng.randrange(vocab) for _ in range(rng.randrange(24, 60))] for _ in range(num_docs)]
    return docs, [d + [rng.randrange(vocab) for _ in range(rng.randrange(1, 9))] for d in docs]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_second_instance_reuses_what_the_first_still_holds(name):
    """A (a pool that never evicts here) serves documents; B, on the same store
    with an empty pool, reuses as much of each as A's own pool would, and every
    block of its hits holds B's request's own data (SimEngine checks)."""
    specs = CONFIGS[name]
    store = CpuStore(1 << 24)
    store.shared = True
    a = SimEngine(specs, num_blocks=200 * len(specs), store=store)
    docs, asked = workload(random.Random(len(name)))
    for doc in docs:
        a.run(doc)
    assert a.tier.stats().written_blocks > 0 and a.kv.num_evictions == 0
    for prompt in asked:
        b = SimEngine(specs, num_blocks=200 * len(specs), store=store)
        own = a.kv.get_computed_blocks(Request("probe", prompt))[1]
        hit, external = b.run(prompt)
        assert hit == external == own > 0
    assert b.checked_blocks > 0


@pytest.mark.parametrize("name", ["full+swa", "all four"])
def test_without_shared_writes_the_held_documents_stay_private(name):
    """The control: the same run on an unshared store gives B nothing."""
    specs = CONFIGS[name]
    store = CpuStore(1 << 24)
    a = SimEngine(specs, num_blocks=200 * len(specs), store=store)
    docs, asked = workload(random.Random(len(name)))
    for doc in docs:
        a.run(doc)
    b = SimEngine(specs, num_blocks=200 * len(specs), store=store)
    assert all(b.run(prompt) == (0, 0) for prompt in asked)
