"""The hybrid fixed point against brute force, over group mixes and random cache states.

The brute-force answer is the largest L <= num_tokens - 1, multiple of every
group's block size, that every group's oracle accepts; the kit compares it
(and the exact blocks of every group) with `get_computed_blocks` after
evicting random blocks of one group at a time, so the groups disagree.
"""

import random

import pytest

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    HybridCoordinator,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from hybridkv.kv_cache import kv_cache_manager
from hybridkv.kv_cache.eviction import EVICTION_POLICIES, make_eviction_policy
from hybridkv.testing import (
    full_is_reusable,
    hybrid_longest_reusable,
    mamba_is_reusable,
    oracle_for,
    random_spec,
    run_hybrid_conformance,
    sliding_window_is_reusable,
)


def sw(bs, window, sinks=0):
    return SlidingWindowSpec(bs, sliding_window=window, num_sink_tokens=sinks)


def chunked(bs, chunk):
    return ChunkedLocalAttentionSpec(bs, attention_chunk_size=chunk)


MIXES = {
    "full8+sliding4": [FullAttentionSpec(8), sw(4, 6)],
    "full4+sliding8": [FullAttentionSpec(4), sw(8, 12)],
    "full4+sliding4+mamba8": [FullAttentionSpec(4), sw(4, 9), MambaSpec(8)],
    "full16+chunked4": [FullAttentionSpec(16), chunked(4, 8)],
    "full4+chunked8": [FullAttentionSpec(4), chunked(8, 16)],
    "sliding4+mamba4": [sw(4, 5), MambaSpec(4)],
    "sliding2+mamba8/2": [sw(2, 3), MambaSpec(8, checkpoint_interval=2)],
    "sinkfull8+sliding4-sinks": [SinkFullAttentionSpec(8, sink_len=8), sw(4, 12, sinks=3)],
    "sinkfull4+full8": [SinkFullAttentionSpec(4, sink_len=4), FullAttentionSpec(8)],
    "sliding4(W=B)+chunked8": [sw(4, 4), chunked(8, 8)],
    "sliding8(W<B)+sliding4": [sw(8, 3), sw(4, 17)],
    "chunked4+mamba4/3": [chunked(4, 12), MambaSpec(4, checkpoint_interval=3)],
    "full4+sliding4-sinks+chunked4": [FullAttentionSpec(4), sw(4, 7, sinks=4), chunked(4, 8)],
    "full8+mamba16+sinkfull8": [FullAttentionSpec(8), MambaSpec(16),
                                SinkFullAttentionSpec(8, sink_len=16)],
    "sliding4(W=1)+full4": [sw(4, 1), FullAttentionSpec(4)],
    "mamba4+mamba8/2": [MambaSpec(4), MambaSpec(8, checkpoint_interval=2)],
    "full2+sliding4+chunked8": [FullAttentionSpec(2), sw(4, 6), chunked(8, 8)],
    "sliding16+mamba4+full8": [sw(16, 20), MambaSpec(4), FullAttentionSpec(8)],
    "full3+sliding2": [FullAttentionSpec(3), sw(2, 5)],  # hashed per token, aligned to 6
    "chunked6+mamba3/2": [chunked(6, 12), MambaSpec(3, checkpoint_interval=2)],
}


@pytest.mark.parametrize("name", list(MIXES))
def test_mix_matches_brute_force(name):
    report = run_hybrid_conformance(MIXES[name], num_cases=25, seed=1, name=name)
    report.assert_ok()
    assert report.num_cases == 25
    assert report.num_hits > 0 and report.num_refusals > 0 and report.num_decode_steps > 0
    assert report.num_disagreements > 0  # queries where the fixed point had to shrink L


CLASSES = [FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec,
           SinkFullAttentionSpec]


def random_mix(rng):
    """Two or three groups of random types, block sizes from 2, 4, 8 and 16."""
    return [random_spec(rng.choice(CLASSES), rng, block_size=rng.choice((2, 4, 8, 16)))
            for _ in range(rng.randint(2, 3))]


def test_random_mixes_match_brute_force():
    report = run_hybrid_conformance(random_mix, num_cases=80, seed=7, name="random mixes")
    report.assert_ok()
    assert report.num_hits > 20 and report.num_disagreements > 20


def test_checks_hold_for_every_eviction_policy():
    make_eviction_policy("lru", [])  # loads the built-in policies
    for policy in sorted(EVICTION_POLICIES):
        report = run_hybrid_conformance(random_mix, num_cases=20, seed=4, name=policy,
                                        eviction_policy=policy)
        report.assert_ok()
    with pytest.raises(ValueError, match="eviction_policy"):
        run_hybrid_conformance(random_mix, num_cases=1, eviction_policy="no such policy")


def allocate_group_by_group(self, request, num_computed_tokens, num_tokens, hit, junction,
                            releases=True, hashes=None):
    """A broken coordinator step: adopts each group's hit just before that group
    takes new blocks, so an earlier group can take a later group's hit block."""
    new_blocks = []
    for i, manager in enumerate(self.managers):
        manager.prepare(request, num_computed_tokens, None if hit is None else hit[i], junction)
        new_blocks.append(manager.allocate_new_blocks(request, num_computed_tokens, num_tokens))
    return tuple(new_blocks)


def test_kit_catches_a_hit_block_taken_by_another_group(monkeypatch):
    monkeypatch.setattr(HybridCoordinator, "allocate", allocate_group_by_group)
    # the coordinator's Python step runs on the Python path: no group type for the C one
    monkeypatch.setattr(kv_cache_manager, "NATIVE_KINDS", {})
    report = run_hybrid_conformance(MIXES["full8+sliding4"], num_cases=25, seed=1)
    assert not report.ok
    assert any("(group, position)" in f for f in report.failures), report.failures[:3]


# ---- the brute-force hybrid oracle itself, by hand ----------------------------


FULL4, FULL8, W5 = FullAttentionSpec(4), FullAttentionSpec(8), sw(4, 5)  # W5 needs 1 block


@pytest.mark.parametrize("groups, max_length, want", [
    # the coordinator docstring's example: full blocks 0-3, window blocks 1 and 3
    ([(full_is_reusable, FULL4, {0, 1, 2, 3}), (sliding_window_is_reusable, W5, {1, 3})],
     16, 16),
    # window block 3 evicted: the window shrinks to 8, full accepts 8
    ([(full_is_reusable, FULL4, {0, 1, 2, 3}), (sliding_window_is_reusable, W5, {1})], 16, 8),
    # mixed block sizes: window alone reaches 12, not a multiple of 8
    ([(full_is_reusable, FULL8, {0, 1}), (sliding_window_is_reusable, W5, {0, 1, 2})], 16, 8),
    ([(full_is_reusable, FULL8, {0, 1}), (sliding_window_is_reusable, W5, {0, 2})], 16, 0),
    # Mamba state only at 8; full reaches 16
    ([(full_is_reusable, FULL4, {0, 1, 2, 3}), (mamba_is_reusable, MambaSpec(8), {0})], 16, 8),
    ([(full_is_reusable, FULL4, {0, 1, 2, 3}), (mamba_is_reusable, MambaSpec(8), {1})], 15, 0),
    ([(full_is_reusable, FULL4, {0, 1, 2, 3}), (mamba_is_reusable, MambaSpec(8), {0, 1})],
     15, 8),
    # 16 lacks a state, 12 is the longest both accept
    ([(mamba_is_reusable, MambaSpec(4), {0, 2}), (sliding_window_is_reusable, W5, {0, 2})],
     16, 12),
    ([(mamba_is_reusable, MambaSpec(4), {0, 2}), (sliding_window_is_reusable, W5, {1})], 16, 0),
])
def test_hybrid_longest_reusable_by_hand(groups, max_length, want):
    assert hybrid_longest_reusable(groups, max_length) == want


def test_hybrid_oracle_is_the_greatest_common_length():
    rng = random.Random(3)
    for _ in range(200):
        specs = random_mix(rng)
        groups = [(oracle_for(s), s, {p for p in range(12) if rng.random() < 0.7})
                  for s in specs]
        got = hybrid_longest_reusable(groups, 40)
        common = [n for n in range(41)
                  if all(n % s.block_size == 0 and o(n, c, s) for o, s, c in groups)]
        assert got == max(common)

