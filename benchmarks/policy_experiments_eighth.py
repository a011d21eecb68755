"""Eighth-round candidate rules: LRU order that is LRU's order.

While the votes say LRU would have kept more, `hybrid` took the never-hit tier
together with the hit tiers "least recently released first". That order was
approximate: blocks were compared by the clock (blocks taken) at their release,
so releases between two takes tied and the never-hit block won every tie; and
the bottom of the never-hit stack is the oldest release's first block (its head),
where LRU takes a release's last block first (its tail, so the prefix before it
stays usable). `hybrid` now keeps its cached free blocks in one more list, in the
order LRU would have them, and takes from its front (`HybridTiers._order`). Each
policy here is `hybrid`'s Python reference with one change:

- `exact_order`: none (`hybrid` as it is; `release_clock_order` is the build
  before, `ReleaseClockOrder`);
- `exact_order_moved`: a block queued again because its rating changed goes to
  the back of the list (and a passed-over kept block too), not where it was;
- `exact_order_wide`: the list is also used when the never-hit tier is empty
  (the hit tiers then go in LRU order too, not hit-once first);
- `exact_order_always`: the list always (a bound: the tiers' other rules with
  LRU's order, votes ignored).

    python benchmarks/bench_policy_grid.py --out DIR \\
        --plugin benchmarks/policy_experiments_eighth.py --policies lru,hybrid,exact_order_moved

Results: docs/eviction-experiments.md, "Eighth round".
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from policy_experiments import RULES_NOW, ReleaseClockOrder  # noqa: E402

from hybridkv.kv_cache.eviction import hybrid as H  # noqa: E402
from hybridkv.kv_cache.eviction import register_eviction_policy  # noqa: E402
from hybridkv.kv_cache.eviction.base import EvictionPolicy  # noqa: E402


class ExactOrder(H.HybridTiers, EvictionPolicy):
    """`hybrid` in Python."""

    uses_hints = True

    def __init__(self, blocks=()):
        super().__init__(blocks, RULES_NOW)


class ReleaseClock(ReleaseClockOrder, ExactOrder):
    """`hybrid` before this round."""


class Moved(ExactOrder):
    def remove_blocks(self, blocks):
        for block in blocks:
            if not block.ref_cnt:  # queued again: `add_free` puts it at the back
                self._order.pop(block, None)
                self._parked.discard(block)
        super().remove_blocks(blocks)


class Wide(ExactOrder):
    def _take(self, num_blocks):
        tiers = self._tiers
        if not self._lru_share > self._tier_share:
            return super()._take(num_blocks)
        # empty and low-value blocks first, then the list over the never-hit and hit
        # tiers until they are empty (not only the never-hit one), then kept blocks
        out = super()._take(min(num_blocks, len(tiers[H.EMPTY]) + len(tiers[H.LOW])))
        taken = len(out)
        while len(out) < num_blocks and (tiers[H.FRESH] or tiers[H.HIT_ONCE]
                                         or tiers[H.HIT_OFTEN]):
            block = self._order.popitem(last=False)[0]
            t = block.queue_slot
            if t < 0:
                continue
            if t == H.KEPT:
                self._parked.add(block)
                continue
            del tiers[t][block]
            if t == H.FRESH:
                self._evicted_fresh([block])
            else:
                self._from_hit.add(block)
            block.queue_slot = -1
            out.append(block)
        self._num_free -= len(out) - taken
        self._clock += len(out) - taken
        return out + super()._take(num_blocks - len(out))


class Always(ExactOrder):
    def __init__(self, blocks=()):
        super().__init__(blocks)
        self._lru_share = 1.0

    def _vote(self, lru, count):
        pass


register_eviction_policy("exact_order", ExactOrder)
register_eviction_policy("release_clock_order", ReleaseClock)
register_eviction_policy("exact_order_moved", Moved)
register_eviction_policy("exact_order_wide", Wide)
register_eviction_policy("exact_order_always", Always)
