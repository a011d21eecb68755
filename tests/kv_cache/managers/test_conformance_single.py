"""The conformance kit on each built-in manager, and on broken managers it must catch.

The oracles are checked first against hand-computed tables from the reuse
rules in docs/kv_cache.md; then every built-in manager runs the randomized suite for
several block sizes, windows (shorter than, equal to and not a multiple of a
block), sinks, chunk sizes and Mamba checkpoint intervals.
"""

import dataclasses
import random

import pytest

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from hybridkv.kv_cache.managers import (
    SPEC_TO_MANAGER,
    ChunkedLocalAttentionManager,
    FullAttentionManager,
    MambaManager,
    SinkFullAttentionManager,
    SlidingWindowManager,
)
from hybridkv.testing import (
    chunked_local_is_reusable,
    full_is_reusable,
    longest_reusable,
    mamba_is_reusable,
    oracle_for,
    random_spec,
    required_positions,
    run_conformance,
    sink_full_is_reusable,
    sliding_window_is_reusable,
)

W8 = SlidingWindowSpec(4, sliding_window=8)  # needs ceil(7/4) = 2 blocks before L
W5_SINK2 = SlidingWindowSpec(4, sliding_window=5, num_sink_tokens=2)  # 1 window + 1 sink block
C8 = ChunkedLocalAttentionSpec(4, attention_chunk_size=8)
M4 = MambaSpec(4)


@pytest.mark.parametrize("oracle, spec, length, cached, reusable", [
    (full_is_reusable, FullAttentionSpec(4), 0, set(), True),
    (full_is_reusable, FullAttentionSpec(4), 8, {0, 1}, True),
    (full_is_reusable, FullAttentionSpec(4), 12, {0, 2}, False),
    (full_is_reusable, FullAttentionSpec(4), 6, {0, 1}, False),  # not a block multiple
    (sink_full_is_reusable, SinkFullAttentionSpec(4, sink_len=4), 8, {0, 1}, True),
    (sliding_window_is_reusable, W8, 16, {2, 3}, True),
    (sliding_window_is_reusable, W8, 16, {1, 2}, False),
    (sliding_window_is_reusable, W8, 8, {0, 1}, True),
    (sliding_window_is_reusable, W8, 4, {0}, True),  # shorter than the window: all blocks
    (sliding_window_is_reusable, W8, 4, set(), False),
    (sliding_window_is_reusable, SlidingWindowSpec(4, sliding_window=3), 12, {2}, True),
    (sliding_window_is_reusable, SlidingWindowSpec(4, sliding_window=4), 12, {1}, False),
    (sliding_window_is_reusable, SlidingWindowSpec(4, sliding_window=1), 12, set(), True),
    (sliding_window_is_reusable, W5_SINK2, 16, {3}, False),  # sink block 0 missing
    (sliding_window_is_reusable, W5_SINK2, 16, {0, 3}, True),
    (chunked_local_is_reusable, C8, 8, set(), True),  # a chunk boundary needs nothing
    (chunked_local_is_reusable, C8, 12, {2}, True),
    (chunked_local_is_reusable, C8, 12, {1}, False),
    (mamba_is_reusable, M4, 0, set(), True),
    (mamba_is_reusable, M4, 8, {1}, True),
    (mamba_is_reusable, M4, 8, {0}, False),
])
def test_builtin_oracles_match_the_rules(oracle, spec, length, cached, reusable):
    assert oracle(length, cached, spec) is reusable
    assert oracle_for(spec) is oracle


@pytest.mark.parametrize("spec, length, need", [
    (FullAttentionSpec(4), 12, {0, 1, 2}),
    (W8, 16, {2, 3}),
    (W8, 4, {0}),
    (W5_SINK2, 16, {0, 3}),
    (C8, 12, {2}),
    (C8, 16, set()),
    (M4, 12, {2}),
])
def test_required_positions(spec, length, need):
    assert required_positions(oracle_for(spec), spec, length) == need


@pytest.mark.parametrize("spec, cached, max_length, want", [
    (FullAttentionSpec(4), {0, 1, 3}, 16, 8),
    (W8, {0, 1, 3, 4}, 20, 20),
    (W8, {0, 1, 3}, 20, 8),  # 16 and 20 need block 2 or 4
    (W8, {1, 2}, 16, 12),
    (C8, {2}, 15, 12),
    (C8, set(), 15, 8),
    (M4, {0, 2}, 11, 4),  # state at 12 is past the limit
])
def test_longest_reusable_by_hand(spec, cached, max_length, want):
    assert longest_reusable(oracle_for(spec), spec, cached, max_length) == want


ORACLE_OF = {FullAttentionSpec: full_is_reusable, SlidingWindowSpec: sliding_window_is_reusable,
             ChunkedLocalAttentionSpec: chunked_local_is_reusable, MambaSpec: mamba_is_reusable,
             SinkFullAttentionSpec: sink_full_is_reusable}

CONFIGS = [
    (FullAttentionSpec(1), FullAttentionManager),
    (FullAttentionSpec(4), FullAttentionManager),
    (FullAttentionSpec, FullAttentionManager),
    (SlidingWindowSpec(4, sliding_window=3), SlidingWindowManager),  # W < B
    (SlidingWindowSpec(4, sliding_window=4), SlidingWindowManager),  # W = B
    (SlidingWindowSpec(4, sliding_window=5), SlidingWindowManager),
    (SlidingWindowSpec(4, sliding_window=10), SlidingWindowManager),  # not a multiple of B
    (SlidingWindowSpec(3, sliding_window=12), SlidingWindowManager),
    (SlidingWindowSpec(4, sliding_window=1), SlidingWindowManager),  # needs no block
    (SlidingWindowSpec(1, sliding_window=5), SlidingWindowManager),
    (SlidingWindowSpec(4, sliding_window=9, num_sink_tokens=2), SlidingWindowManager),
    (SlidingWindowSpec(3, sliding_window=7, num_sink_tokens=4), SlidingWindowManager),
    (SlidingWindowSpec(2, sliding_window=3, num_sink_tokens=5), SlidingWindowManager),
    (SlidingWindowSpec, SlidingWindowManager),
    (ChunkedLocalAttentionSpec(4, attention_chunk_size=4), ChunkedLocalAttentionManager),
    (ChunkedLocalAttentionSpec(4, attention_chunk_size=12), ChunkedLocalAttentionManager),
    (ChunkedLocalAttentionSpec(2, attention_chunk_size=8), ChunkedLocalAttentionManager),
    (ChunkedLocalAttentionSpec(1, attention_chunk_size=3), ChunkedLocalAttentionManager),
    (ChunkedLocalAttentionSpec, ChunkedLocalAttentionManager),
    (MambaSpec(4), MambaManager),
    (MambaSpec(4, checkpoint_interval=3), MambaManager),
    (MambaSpec(1), MambaManager),
    (MambaSpec(8, checkpoint_interval=2), MambaManager),
    (MambaSpec, MambaManager),
    (SinkFullAttentionSpec(4, sink_len=4), SinkFullAttentionManager),
    (SinkFullAttentionSpec(2, sink_len=6), SinkFullAttentionManager),
    (SinkFullAttentionSpec, SinkFullAttentionManager),
]


def config_id(value):
    if isinstance(value, type):
        return value.__name__
    shown = ("block_size", "sliding_window", "num_sink_tokens", "attention_chunk_size",
             "sink_len", "checkpoint_interval")
    return type(value).__name__ + "".join(f"-{getattr(value, f)}" for f in shown
                                          if hasattr(value, f))


@pytest.mark.parametrize("spec, manager_class", CONFIGS, ids=config_id)
def test_builtin_manager_conforms(spec, manager_class):
    oracle = ORACLE_OF[spec if isinstance(spec, type) else type(spec)]
    report = run_conformance(spec, manager_class, oracle, num_cases=30)
    report.assert_ok()
    assert report.num_cases == 30
    assert report.num_hits > 0 and report.num_refusals > 0 and report.num_decode_steps > 0


# ---- broken managers the kit must catch ----------------------------------------


class ShortWindowManager(SlidingWindowManager):
    """Searches as if the window were one block shorter."""

    def find_longest_cache_hit(self, block_hashes, max_length):
        real = self.spec
        self.spec = dataclasses.replace(
            real, sliding_window=max(1, real.sliding_window - real.block_size))
        try:
            return super().find_longest_cache_hit(block_hashes, max_length)
        finally:
            self.spec = real


class UnnulledChunkManager(ChunkedLocalAttentionManager):
    """Returns (and so touches) cached blocks before the chunk start."""

    def find_longest_cache_hit(self, block_hashes, max_length):
        hit = super().find_longest_cache_hit(block_hashes, max_length)
        full = FullAttentionManager.find_longest_cache_hit(self, block_hashes,
                                                           len(hit) * self.block_size)
        return full if len(full) == len(hit) else hit


class FirstStateMambaManager(MambaManager):
    """Takes the first cached state instead of the last."""

    def find_longest_cache_hit(self, block_hashes, max_length):
        hashes = self.group_hashes(block_hashes, max_length // self.block_size)
        for i, block_hash in enumerate(hashes):
            block = self.cached_block(block_hash)
            if block is not None:
                return [self.null_block] * i + [block]
        return []


class HoleyFullManager(FullAttentionManager):
    """Reads past a missing block as if it were not needed."""

    def find_longest_cache_hit(self, block_hashes, max_length):
        get = self.cached_block
        hit = [get(h) or self.null_block
               for h in self.group_hashes(block_hashes, max_length // self.block_size)]
        while hit and hit[-1] is self.null_block:
            hit.pop()
        return hit


class EarlySkipManager(SlidingWindowManager):
    """Releases the oldest window block one block too early."""

    def num_skipped_blocks(self, request, num_computed_tokens):
        first = num_computed_tokens - self.spec.sliding_window + 1 + self.block_size
        return max(first, 0) // self.block_size


class NeverSkipManager(SlidingWindowManager):
    """Holds every block of a request to the end."""

    skips = False


class ReleaseOnCheckManager(SlidingWindowManager):
    """Releases blocks a window left behind while only checking the count."""

    def num_blocks_to_allocate(self, request, num_computed_tokens, num_tokens, hit, junction):
        if not hit:
            self.remove_skipped_blocks(request, num_computed_tokens, junction)
        return super().num_blocks_to_allocate(request, num_computed_tokens, num_tokens, hit,
                                              junction)


class ForgetfulFullManager(FullAttentionManager):
    """Forgets to return a request's first block when it ends."""

    def free(self, request, junction):
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks and len(blocks) > 3:
            blocks.pop(0)
        super().free(request, junction)


@pytest.mark.parametrize("spec_class, manager_class, oracle, symptom", [
    (SlidingWindowSpec, ShortWindowManager, sliding_window_is_reusable, "the oracle says"),
    (ChunkedLocalAttentionSpec, UnnulledChunkManager, chunked_local_is_reusable,
     "the oracle says"),
    (MambaSpec, FirstStateMambaManager, mamba_is_reusable, "the oracle says"),
    (FullAttentionSpec, HoleyFullManager, full_is_reusable, "the oracle says"),
    (SlidingWindowSpec, EarlySkipManager, sliding_window_is_reusable, "a block they read"),
    (SlidingWindowSpec, NeverSkipManager, sliding_window_is_reusable, "decoding at"),
    (SlidingWindowSpec, ReleaseOnCheckManager, sliding_window_is_reusable,
     "a refused allocate_slots"),
    (FullAttentionSpec, ForgetfulFullManager, full_is_reusable, "leaked"),
    (SlidingWindowSpec, SlidingWindowManager, full_is_reusable, ""),  # the wrong rule
])
def test_kit_catches_broken_manager(spec_class, manager_class, oracle, symptom):
    registry = dict(SPEC_TO_MANAGER)
    report = run_conformance(spec_class, manager_class, oracle, num_cases=30)
    assert not report.ok and report.num_failed_cases > 0
    assert any(symptom in f for f in report.failures), report.failures[:3]
    with pytest.raises(AssertionError):
        report.assert_ok()
    assert SPEC_TO_MANAGER == registry  # the override was undone


def test_replaying_one_case_gives_the_same_result():
    first = run_conformance(MambaSpec, FirstStateMambaManager, mamba_is_reusable, num_cases=12)
    case = int(first.failures[0].split()[1])
    again = run_conformance(MambaSpec, FirstStateMambaManager, mamba_is_reusable,
                            num_cases=1, first_case=case)
    assert again.failures == [first.failures[0]]


def test_factory_and_fixed_spec_sources():
    report = run_conformance(lambda rng: SlidingWindowSpec(2, sliding_window=rng.randint(1, 9)),
                             SlidingWindowManager, sliding_window_is_reusable, num_cases=10)
    report.assert_ok()
    assert report.num_cases == 10


class UnknownSpec(KVCacheSpec):
    @property
    def page_size_bytes(self):
        return 64


@pytest.mark.parametrize("kwargs", [
    dict(spec_source=FullAttentionSpec, manager_class=object, is_reusable=full_is_reusable),
    dict(spec_source=FullAttentionSpec, manager_class=FullAttentionManager, is_reusable=3),
    dict(spec_source=FullAttentionSpec, manager_class=FullAttentionManager,
         is_reusable=full_is_reusable, num_cases=0),
    dict(spec_source=UnknownSpec, manager_class=FullAttentionManager,
         is_reusable=full_is_reusable),
    dict(spec_source=lambda rng: "not a spec", manager_class=FullAttentionManager,
         is_reusable=full_is_reusable),
])
def test_bad_input_raises_value_error(kwargs):
    with pytest.raises(ValueError):
        run_conformance(**kwargs)


def test_no_oracle_or_generator_for_unknown_spec():
    with pytest.raises(ValueError, match="no oracle"):
        oracle_for(UnknownSpec(4))
    with pytest.raises(ValueError, match="no random generator"):
        random_spec(UnknownSpec, random.Random(0))
