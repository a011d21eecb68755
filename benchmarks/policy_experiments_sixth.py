"""Sixth-round candidate rules: variants of the LRU votes with exact LRU positions.

Each policy is `hybrid`'s Python reference (`HybridTiers`, the same decisions as
the C tiers) with one change; `votes_reference` is `hybrid` itself, with LRU order
by release clocks as before the eighth round (`ReleaseClockOrder`):

    python benchmarks/bench_policy_grid.py --out DIR \\
        --plugin benchmarks/policy_experiments_sixth.py \\
        --policies lru,hybrid,votes_warm --shapes agent_loop,multi_turn,hot_cold

Results: docs/eviction-experiments.md, "Sixth round".
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from policy_experiments import ReleaseClockOrder, take_by_release_clock  # noqa: E402

from hybridkv.kv_cache.eviction import hybrid as H  # noqa: E402
from hybridkv.kv_cache.eviction import register_eviction_policy  # noqa: E402
from hybridkv.kv_cache.eviction.base import EvictionPolicy  # noqa: E402


def votes(weight=None, back=None, hit_vote=1.0, warm_pools=0.0, per_event=False,
          start_lru=False, mark_lru_takes=False, kept_votes=True, low_in_lru=False,
          start_bottom=False, stale_check=False):
    """`hybrid` with:

    - `weight`, `back`: VOTE_WEIGHT and VOTE_BACK (None: the module's);
    - `hit_vote`: the weight of a hit on data LRU would have dropped;
    - `warm_pools`: no vote before that many pools' worth of blocks were evicted;
    - `per_event`: at most one vote of each kind per step (between two takes) and
      one per hit, however many blocks;
    - `start_lru`: LRU order until the first vote for the tiers;
    - `mark_lru_takes`: never-hit blocks taken in LRU order (not the newest release)
      vote for the tiers when they come back, as hit blocks taken so do;
    - `kept_votes=False`: hits on blocks kept for a running request (`PROTECTED`,
      last in either order) do not vote;
    - `low_in_lru`: while LRU order wins, blocks rated low value join it too (least
      recently released first over them, the never-hit bottom and the hit fronts)
      instead of going first;
    - `start_bottom`: until the first vote, the never-hit tier is taken from the bottom
      of its stack (least recently released first), the hit tiers left alone;
    - `stale_check`: the stale rule is checked against its own evictions: hit data it
      took that comes back counts against it, never-hit data taken while it was on
      that comes back counts for it (shares decaying by 1/64); it is on only while
      the share for it is at least the share against it.
    """
    class Votes(ReleaseClockOrder, H.HybridTiers, EvictionPolicy):
        uses_hints = True

        def __init__(self, blocks=()):
            super().__init__(blocks, (
                H.AGE_EVERY, H.STALE_AGE, H.REUSE_DECAY, H.RETURN_GATE, H.RETURN_WEIGHT,
                H.VOTE_WEIGHT if weight is None else weight,
                H.VOTE_BACK if back is None else back, H.GHOST_POOLS))
            self._evictions = 0
            self._stamps: dict = {}
            self._hit_call = 0
            self._stale_taken: dict = {}
            self._stale_for = self._stale_against = 0.0
            if start_lru:
                self._lru_share = 1e-9

        def take(self, num_blocks):
            out = super().take(num_blocks)
            self._evictions += sum(b.block_hash is not None for b in out)
            return out

        def remove_blocks(self, blocks):
            self._hit_call += 1
            if kept_votes:
                return super().remove_blocks(blocks)
            kept = [b for b in blocks if b.queue_slot == H.KEPT]
            marks = {b: self._marks[b] for b in kept}
            for b in kept:  # no vote: as if LRU would still hold them
                self._marks[b] = (marks[b][0], marks[b][1] + 10**12)
            super().remove_blocks(blocks)

        def _take(self, num_blocks):
            if start_bottom and self._lru_share == 0 and self._tier_share == 0:
                tiers, out = self._tiers, []
                while len(out) < num_blocks:
                    t = next(i for i, tier in enumerate(tiers) if tier)
                    top = t == H.EMPTY
                    n = min(num_blocks - len(out), len(tiers[t]))
                    taken = [tiers[t].popitem(top)[0] for _ in range(n)]
                    for block in taken:
                        block.queue_slot = -1
                    out += taken
                    if t == H.FRESH:
                        self._evicted_fresh(taken)
                self._num_free -= len(out)
                self._clock += len(out)
                return out
            lru = self._lru_share > self._tier_share
            if not (low_in_lru and lru and self._tiers[H.LOW]):
                return super()._take(num_blocks)
            tiers, out = self._tiers, []
            while len(out) < num_blocks:
                t = next(i for i, tier in enumerate(tiers) if tier)
                if t in (H.LOW, H.FRESH):
                    self._take_low_lru(out, num_blocks - len(out))
                    continue
                pop, top = tiers[t].popitem, t in H.STACKS
                taken = [pop(top)[0] for _ in range(min(num_blocks - len(out), len(tiers[t])))]
                for block in taken:
                    block.queue_slot = -1
                out += taken
            self._num_free -= len(out)
            self._clock += len(out)
            return out

        def _take_low_lru(self, out, num_blocks):
            tiers = self._tiers
            while num_blocks and (tiers[H.LOW] or tiers[H.FRESH]):
                best_t, best = None, None
                for t in (H.LOW, H.FRESH, H.HIT_ONCE, H.HIT_OFTEN):
                    tier = tiers[t]
                    if tier:
                        released = tier[next(iter(tier))]
                        if best is None or released < best:
                            best_t, best = t, released
                block = tiers[best_t].popitem(last=False)[0]
                if best_t == H.FRESH:
                    self._evicted_fresh([block])
                elif best_t != H.LOW:
                    self._from_hit.add(block)
                block.queue_slot = -1
                out.append(block)
                num_blocks -= 1

        def _take_fresh(self, out, num_blocks):
            if not stale_check:
                return super()._take_fresh(out, num_blocks)
            tiers, fresh = self._tiers, self._tiers[H.FRESH]
            on = self._stale_for >= self._stale_against
            limit = self._clock + len(out) - self._stale_age * self._reuse
            while num_blocks and fresh:
                block = None
                for t in (H.HIT_ONCE, H.HIT_OFTEN):
                    tier = tiers[t]
                    if on and tier and tier[next(iter(tier))] < limit:
                        block = tier.popitem(last=False)[0]
                        self._stale_taken[block.block_hash] = True
                        break
                if block is None:
                    bottom = on and fresh[next(iter(fresh))] < limit
                    block = fresh.popitem(last=not bottom)[0]
                    self._evicted_fresh([block])
                    if block.block_hash is not None:
                        self._stale_taken[block.block_hash] = False
                block.queue_slot = -1
                out.append(block)
                num_blocks -= 1
                limit += 1
            while len(self._stale_taken) > self._watch_limit:
                del self._stale_taken[next(iter(self._stale_taken))]

        def recomputed(self, block_hash):
            if stale_check:
                was_stale = self._stale_taken.pop(block_hash, None)
                if was_stale is not None:
                    keep = 1 - 1 / 64
                    self._stale_for *= keep
                    self._stale_against *= keep
                    if was_stale:
                        self._stale_against += 1 / 64
                    else:
                        self._stale_for += 1 / 64
            super().recomputed(block_hash)

        def _take_lru(self, out, num_blocks):
            if not mark_lru_takes:
                return super()._take_lru(out, num_blocks)
            fresh = self._tiers[H.FRESH]

            def taken(block, t):  # a never-hit block left alone: the tiers would take it too
                if t != H.FRESH or fresh:
                    self._from_hit.add(block)
            take_by_release_clock(self, out, num_blocks, taken)

        def _vote(self, lru, count):
            if self._evictions < warm_pools * self._watch_limit:
                return
            if not lru and count == 1.0:
                count = hit_vote
                stamp = ("hit", self._hit_call)
            else:
                stamp = ("step", self._clock)
            if per_event:
                key = (lru, count)
                if self._stamps.get(key) == stamp:
                    return
                self._stamps[key] = stamp
            super()._vote(lru, count)

    return Votes


for _name, _rule in {
    "votes_reference": votes(),
    "votes_hit_half": votes(hit_vote=0.5),
    "votes_hit_quarter": votes(hit_vote=0.25),
    "votes_weight_32": votes(weight=1 / 32),
    "votes_weight_128": votes(weight=1 / 128),
    "votes_back_2": votes(back=2.0),
    "votes_warm": votes(warm_pools=1.0),
    "votes_per_event": votes(per_event=True),
    "votes_start_lru": votes(start_lru=True),
    "votes_start_lru_marked": votes(start_lru=True, mark_lru_takes=True),
    "votes_marked": votes(mark_lru_takes=True),
    "votes_not_kept": votes(kept_votes=False),
    "votes_low_in_lru": votes(low_in_lru=True),
    "votes_start_bottom": votes(start_bottom=True),
    "votes_stale_check": votes(stale_check=True),
}.items():
    register_eviction_policy(_name, _rule)
