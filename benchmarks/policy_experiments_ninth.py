"""Ninth-round candidates: the last agent-loop cell below `lru`.

- the sliding-window tail margin (`SlidingWindowManager.tail_margin_tokens`, the
  stops near a prompt's end whose windows keep their rating): set for the whole
  run by the environment variable `TAIL_MARGIN` (tokens), for every policy;
- `hybrid`'s constants on LRU's own order (the C policy, one constant changed):
  `vote_w32`, `vote_w128` (VOTE_WEIGHT 1/32, 1/128), `vote_back2`, `vote_back8`,
  `ghosts2`, `ghosts8`, `age4`, `age16`, `stale125`, `stale2`, `gate005`, `gate02`;
- `refund`: evicted data computed again that one LRU queue would still have held
  was a hit in LRU's world, not an allocation: the votes' queue records one block
  taken fewer (`refund_all`: for hit data taken in LRU order too;
  `refund_sym`: and a hit on data LRU would have dropped records one block taken
  more). The seventh round's `lru_history_returns` also recorded a hit there.

    TAIL_MARGIN=128 python benchmarks/bench_policy_grid.py --out DIR \\
        --plugin benchmarks/policy_experiments_ninth.py --policies lru,hybrid,refund

Results: docs/eviction-experiments.md, "Ninth round".
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from policy_experiments_eighth import ExactOrder  # noqa: E402

from hybridkv.kv_cache.eviction import hybrid as H  # noqa: E402
from hybridkv.kv_cache.eviction import register_eviction_policy  # noqa: E402
from hybridkv.kv_cache.managers.sliding_window import SlidingWindowManager  # noqa: E402

if os.environ.get("TAIL_MARGIN"):
    SlidingWindowManager.tail_margin_tokens = int(os.environ["TAIL_MARGIN"])

RULE_NAMES = ("age", "stale", "decay", "gate", "return_weight", "vote_weight", "vote_back",
              "ghosts")


def with_rules(name: str, **changes: float) -> None:
    """Register `hybrid` (C when built) with some of its constants changed."""
    rules = dict(zip(RULE_NAMES, (H.AGE_EVERY, H.STALE_AGE, H.REUSE_DECAY, H.RETURN_GATE,
                                  H.RETURN_WEIGHT, H.VOTE_WEIGHT, H.VOTE_BACK, H.GHOST_POOLS)))
    rules.update(changes)
    values = tuple(rules[n] for n in RULE_NAMES)

    class Changed(H.HybridPolicy):
        def __init__(self, blocks=()):
            H.TiersBase.__init__(self, blocks, values)

    register_eviction_policy(name, Changed)


for _name, _changes in {
        "vote_w32": dict(vote_weight=1 / 32), "vote_w128": dict(vote_weight=1 / 128),
        "vote_back2": dict(vote_back=2.0), "vote_back8": dict(vote_back=8.0),
        "ghosts2": dict(ghosts=2), "ghosts8": dict(ghosts=8),
        "age4": dict(age=4), "age16": dict(age=16),
        "stale125": dict(stale=1.25), "stale2": dict(stale=2.0),
        "gate005": dict(gate=0.05), "gate02": dict(gate=0.2)}.items():
    with_rules(_name, **_changes)


class Refund(ExactOrder):
    """Evicted never-hit data LRU would still have held that comes back: one take fewer."""

    from_hit_too = False

    def recomputed(self, block_hash):
        number, base, from_hit = self._ghosts[block_hash]
        held = (self.from_hit_too or not from_hit) and self._lru.position((number, base)) >= 0
        super().recomputed(block_hash)
        if held:
            self._lru.taken(-1)


class RefundAll(Refund):
    from_hit_too = True


class RefundSym(Refund):
    """... and a hit on data LRU would have dropped: one take more."""

    def remove_blocks(self, blocks):
        lru, marks = self._lru, self._marks
        missed = sum(1 for b in blocks if b.block_hash is not None and b.queue_slot >= H.FRESH
                     and lru.position(marks[b]) < 0)
        super().remove_blocks(blocks)
        lru.taken(missed)


register_eviction_policy("refund", Refund)
register_eviction_policy("refund_all", RefundAll)
register_eviction_policy("refund_sym", RefundSym)
