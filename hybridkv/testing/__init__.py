"""Conformance kit: check a KV cache manager against brute-force reuse rules.

Run the suite on your own manager (pytest-friendly: `report.assert_ok()`)::

    from hybridkv.testing import run_conformance, sliding_window_is_reusable
    report = run_conformance(SlidingWindowSpec, MySlidingManager, sliding_window_is_reusable)
    report.assert_ok()

`run_hybrid_conformance(specs)` checks a group mix against the hybrid rule;
the oracles and brute-force helpers are usable on their own. For model
runners, `hybridkv.testing.models` holds the reference decode
(`hf_greedy_no_cache`: Hugging Face's forward, no cache) and `slow_decay`
(makes Mamba state matter); it needs torch, so it is not imported here.

This package depends on `kv_cache` only (and torch in `models`). The replay
driver, the clairvoyant cache and the digests are in `hybridkv.tools`.
"""

from hybridkv.testing.conformance import (
    ConformanceError,
    ConformanceReport,
    run_conformance,
    run_hybrid_conformance,
)
from hybridkv.testing.oracles import (
    BUILTIN_ORACLES,
    DecodeBound,
    HybridExpectation,
    Oracle,
    SpecSource,
    cached_positions,
    chunked_local_is_reusable,
    decode_block_bound,
    expected_hit,
    full_is_reusable,
    hybrid_expectation,
    hybrid_longest_reusable,
    longest_reusable,
    mamba_is_reusable,
    oracle_for,
    random_spec,
    reach_tokens,
    replay_block_events,
    required_positions,
    sink_full_is_reusable,
    sliding_window_is_reusable,
    snapshot_diff,
    spec_factory,
    state_snapshot,
)

__all__ = [
    "BUILTIN_ORACLES", "ConformanceError", "ConformanceReport", "DecodeBound",
    "HybridExpectation", "Oracle", "SpecSource", "cached_positions", "chunked_local_is_reusable",
    "decode_block_bound", "expected_hit", "full_is_reusable", "hybrid_expectation",
    "hybrid_longest_reusable", "longest_reusable", "mamba_is_reusable", "oracle_for",
    "random_spec", "reach_tokens", "replay_block_events", "required_positions",
    "run_conformance", "run_hybrid_conformance", "sink_full_is_reusable",
    "sliding_window_is_reusable", "snapshot_diff", "spec_factory", "state_snapshot",
]
