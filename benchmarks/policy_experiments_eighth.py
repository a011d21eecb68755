"""Eighth-round candidate rules: LRU order that is LRU's order.

While the votes say LRU would have kept more, `hybrid` takes the never-hit tier
together with the hit tiers "least recently released first". That order was
approximate: blocks were compared by the clock (blocks taken) at their release,
so releases between two takes tied and the never-hit block won every tie; and
the bottom of the never-hit stack is the oldest release's first block (its head),
where LRU takes a release's last block first (its tail, so the prefix before it
stays usable). Each policy here is `hybrid`'s Python reference (`HybridTiers`)
as it was before this round (`ReleaseClockOrder`) with one change; `hybrid` now
runs `exact_order` (with kept blocks parked, which gives the same figures):

- `exact_order`: cached free blocks are also kept in one list in the order LRU
  would have them (the order they were released in, a release tail first as
  given); in LRU order the never-hit and hit tiers are taken from the front of
  that list. A block queued again because its rating changed keeps its place;
- `exact_order_moved`: the same, a block queued again goes to the back;
- `exact_order_wide`: the same list, also used when the never-hit tier is empty
  (the hit tiers then go in LRU order too, not hit-once first);
- `exact_order_always`: the list always (a bound: the tiers' other rules with
  LRU's order, votes ignored).

    python benchmarks/bench_policy_grid.py --out DIR \\
        --plugin benchmarks/policy_experiments_eighth.py --policies lru,hybrid,exact_order

Results: docs/eviction-experiments.md, "Eighth round".
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from policy_experiments import ReleaseClockOrder  # noqa: E402

from hybridkv.kv_cache.eviction import hybrid as H  # noqa: E402
from hybridkv.kv_cache.eviction import register_eviction_policy  # noqa: E402
from hybridkv.kv_cache.eviction.base import EvictionPolicy  # noqa: E402

ORDERED = (H.FRESH, H.HIT_ONCE, H.HIT_OFTEN)


def exact_order(in_place: bool = True, wide: bool = False, always: bool = False):
    class ExactOrder(ReleaseClockOrder, H.HybridTiers, EvictionPolicy):
        uses_hints = True

        def __init__(self, blocks=()):
            super().__init__(blocks, (
                H.AGE_EVERY, H.STALE_AGE, H.REUSE_DECAY, H.RETURN_GATE, H.RETURN_WEIGHT,
                H.VOTE_WEIGHT, H.VOTE_BACK, H.GHOST_POOLS))
            self._lru_list: OrderedDict = OrderedDict()  # cached free blocks, LRU's order

        def add_free(self, blocks):
            blocks = list(blocks)
            order = self._lru_list
            for block in blocks:
                if block.block_hash is not None and not (in_place and block in order):
                    order[block] = None
            super().add_free(blocks)

        def remove_blocks(self, blocks):
            order = self._lru_list
            for block in blocks:
                if not (in_place and block.ref_cnt == 0):  # ref_cnt 0: queued again
                    order.pop(block, None)
            super().remove_blocks(blocks)

        def uncache(self, block):
            self._lru_list.pop(block, None)
            super().uncache(block)

        def take(self, num_blocks):
            out = super().take(num_blocks)
            order = self._lru_list
            for block in out:
                order.pop(block, None)
            return out

        def _take(self, num_blocks):
            if not (always or self._lru_share > self._tier_share):
                return super()._take(num_blocks)
            tiers, out = self._tiers, []
            while len(out) < num_blocks:
                t = next(i for i, tier in enumerate(tiers) if tier)
                if t == H.FRESH or wide and t in ORDERED:
                    self._take_ordered(out, num_blocks - len(out))
                    continue
                pop, top = tiers[t].popitem, t in H.STACKS
                taken = [pop(top)[0] for _ in range(min(num_blocks - len(out), len(tiers[t])))]
                for block in taken:
                    block.queue_slot = -1
                out += taken
            self._num_free -= len(out)
            self._clock += len(out)
            return out

        def _take_ordered(self, out, num_blocks):
            tiers, order = self._tiers, self._lru_list
            fresh = tiers[H.FRESH]
            skipped = []
            while num_blocks and (fresh or wide and (tiers[H.HIT_ONCE] or tiers[H.HIT_OFTEN])):
                block = next(iter(order))
                t = block.queue_slot
                if t not in ORDERED:  # kept for a running request: not in this order now
                    order.move_to_end(block, last=False)
                    skipped.append(block)
                    del order[block]
                    continue
                del tiers[t][block]
                del order[block]
                if t == H.FRESH:
                    self._evicted_fresh([block])
                else:
                    self._from_hit.add(block)
                block.queue_slot = -1
                out.append(block)
                num_blocks -= 1
            for block in reversed(skipped):  # back at the front, in their order
                order[block] = None
                order.move_to_end(block, last=False)

    return ExactOrder


register_eviction_policy("exact_order", exact_order())
register_eviction_policy("exact_order_moved", exact_order(in_place=False))
register_eviction_policy("exact_order_wide", exact_order(wide=True))
register_eviction_policy("exact_order_always", exact_order(always=True))
