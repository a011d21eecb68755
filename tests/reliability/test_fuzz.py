"""Stateful fuzzing of KVCacheManager (support/fuzz.py), bounded for CI.

Every config runs under both eviction policies with a fixed number of
derandomized examples. Planted bugs (a stale hash map, a window released one
block early, a Mamba hit one boundary off, a wrong key for a group with larger
blocks) must each be caught by the shadow of block contents alone, with the
brute-force oracle switched off: the checks are not vacuous.
"""

import os
import subprocess
import sys
from unittest.mock import patch

import pytest
from hypothesis.stateful import run_state_machine_as_test
from support.fuzz import (
    CONFIGS,
    EVICTION_POLICIES,
    FuzzStats,
    fuzz_settings,
    make_machine,
    run_fuzz,
)
from support.shadow import ShadowViolation, kept_boundaries, positions_read

from hybridkv.kv_cache import kv_cache_manager
from hybridkv.kv_cache.block_pool import BlockPool
from hybridkv.kv_cache.eviction import NORMAL_VALUE
from hybridkv.kv_cache.managers.base import SingleTypeManager
from hybridkv.kv_cache.managers.mamba import MambaManager
from hybridkv.kv_cache.managers.sliding_window import SlidingWindowManager

EXAMPLES_PER_CONFIG = 10


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_machine_finds_no_violation(config, policy):
    machine = make_machine([config], [policy])
    run_state_machine_as_test(machine, settings=fuzz_settings(EXAMPLES_PER_CONFIG, steps=50))
    stats = machine.stats
    assert stats.examples >= EXAMPLES_PER_CONFIG and stats.allocations > 0
    assert set(stats.configs) == {f"{config}/{policy}"}


def test_all_configs_together_exercise_hits_refusals_and_preemptions():
    stats = FuzzStats()
    machine = make_machine(stats=stats)
    run_state_machine_as_test(machine, settings=fuzz_settings(40, steps=60))
    assert stats.hits > 0 and stats.hit_tokens > 0, stats
    assert stats.refusals > 0 and stats.preemptions > 0 and stats.decoded_tokens > 0, stats
    assert stats.explicit_evictions > 0 and stats.resets > 0, stats


# ---- planted bugs the shadow must catch --------------------------------------


def _get_new_blocks_keeping_hashes(self, num_blocks):
    """Takes blocks for new data but leaves them findable under their old hash."""
    blocks = self.free_queue.take(num_blocks)
    for block in blocks:
        block.ref_cnt, block.num_hits, block.value_hint = 1, 0, NORMAL_VALUE
    return blocks


def _one_block_early(self, request, num_computed_tokens):
    first_needed = num_computed_tokens - self.spec.sliding_window + 1 + self.block_size
    return max(first_needed, 0) // self.block_size


def _mamba_hit_one_boundary_late(self, block_hashes, max_length):
    hit = MAMBA_SEARCH(self, block_hashes, max_length)
    return [self.null_block] + hit if hit and (len(hit) + 1) * self.block_size <= max_length \
        else hit


def _first_small_block_key(self, block_hashes, num_blocks):
    return block_hashes[0:num_blocks * self.stride:self.stride]


MAMBA_SEARCH = MambaManager.find_longest_cache_hit
PLANTED = {
    "stale hash map": (patch.object(BlockPool, "get_new_blocks",
                                    _get_new_blocks_keeping_hashes), ["full", "sliding"]),
    "window released early": (patch.object(SlidingWindowManager, "num_skipped_blocks",
                                           _one_block_early), ["sliding"]),
    "mamba hit off by a boundary": (patch.object(MambaManager, "find_longest_cache_hit",
                                                 _mamba_hit_one_boundary_late), ["mamba"]),
    "wrong key for larger blocks": (patch.object(SingleTypeManager, "group_hashes",
                                                 _first_small_block_key),
                                    ["full_sliding_mixed_blocks"]),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_shadow_catches_planted_bug(bug):
    planted, configs = PLANTED[bug]
    machine = make_machine(configs, ["lru"], check_oracle=False)
    # the bugs are planted in Python methods: the managers run the Python paths
    python_paths = patch.object(kv_cache_manager, "NATIVE_KINDS", {})
    with planted, python_paths, pytest.raises(ShadowViolation):
        run_state_machine_as_test(machine, settings=fuzz_settings(300, steps=50, shrink=False))


# ---- the shadow's own rules, on worked examples -------------------------------


def test_positions_read_restates_each_attention_rule():
    from hybridkv import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

    assert positions_read(FullAttentionSpec(4), 9, 11) == {0, 1, 2}
    assert positions_read(SlidingWindowSpec(4, sliding_window=6), 9, 11) == {1, 2}
    assert positions_read(SlidingWindowSpec(4, sliding_window=2, num_sink_tokens=5),
                          13, 14) == {0, 1, 3}
    assert positions_read(ChunkedLocalAttentionSpec(4, attention_chunk_size=8), 9, 17) == \
        {2, 3, 4}


def test_kept_boundaries_follow_the_retention_policy():
    from hybridkv import MambaSpec

    assert kept_boundaries(MambaSpec(4), 10, 0, 13) == [1, 2, 3]
    assert kept_boundaries(MambaSpec(4, checkpoint_interval=3), 22, 4, 30) == [3, 5, 6]


def test_run_fuzz_reports_what_it_ran():
    result = run_fuzz(0.5, config_names=["full_sliding_mamba"], examples_per_run=5)
    assert result.runs >= 1 and result.stats.examples >= 5 and result.stats.steps > 0
    assert result.violations == []
    with pytest.raises(ValueError, match="nope"):
        make_machine(["nope"])


def test_the_package_imports_without_the_test_extras():
    # hypothesis and pytest are test extras: the conformance kit and the replay,
    # digest and mix modules the benchmarks use must import without them
    code = ("import sys; sys.modules['hypothesis'] = sys.modules['pytest'] = None\n"
            "import hybridkv.testing, hybridkv.tools.digest, hybridkv.tools.ideal\n"
            "print(len(hybridkv.tools.spec_mixes.CONFIGS))\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(CONFIGS)
