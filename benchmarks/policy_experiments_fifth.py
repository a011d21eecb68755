"""Fifth-round candidate eviction rules (agent loops against multi-turn).

Built on `Reference` (the Python `hybrid` before this round, without the LRU votes)
of benchmarks/policy_experiments.py, which this file imports, so one plugin
registers both rounds. `lru_vote` with its defaults is the rule `hybrid` adopted
in that round, with its access-clock estimate of LRU positions (`reference_now`
there is `hybrid` as it is now, with exact positions: sixth round):

    python benchmarks/bench_policy_grid.py --out DIR \
        --plugin benchmarks/policy_experiments_fifth.py \
        --policies lru,hybrid,ghost_age --shapes agent_loop,multi_turn --kinds swa,full
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from policy_experiments import Reference, hits_into, take_by_release_clock  # noqa: E402

from hybridkv.kv_cache.eviction import register_eviction_policy  # noqa: E402
from hybridkv.kv_cache.eviction.hybrid import (  # noqa: E402
    FRESH,
    HIT_OFTEN,
    HIT_ONCE,
    HybridTiers,
)


def ghost_age(down=0.02, up=0.02, low=0.25, high=3.0):
    """ARC-style stale age: evicted blocks are remembered with the tier they left;
    never-hit data that comes back lowers the stale age (x (1 - down)), stale hit
    data that comes back raises it (x (1 + up)), between `low` and `high`."""
    class GhostAge(Reference):
        def _hit_evicted(self, block):
            self._watch_hit(block)

        def _hit_returned(self):
            self._stale_age = min(high, self._stale_age * (1 + up))

        def recomputed(self, block_hash):
            if block_hash in self._watched and not self._watched[block_hash]:
                self._stale_age = max(low, self._stale_age * (1 - down))
            super().recomputed(block_hash)
    return GhostAge


def lru_vote(weight=1 / 64, margin=1.0, back=4.0, ghosts=8, gated=False, access=True,
             whole=False):
    """The tiers, or least recently released first over the never-hit bottom and the hit
    tiers when the never-hit tier is taken, whichever the evidence favours.

    Evidence, kept on an access clock (blocks taken plus blocks hit; with
    `access=False`, blocks taken): a block released when f blocks were free would
    still be cached under plain LRU if fewer than f blocks were accessed before its
    reuse (the blocks ahead of it in one LRU queue). Evicted data computed again that
    LRU would still have held votes LRU; a hit on data LRU would have dropped votes the
    tiers; hit data taken in LRU order that is computed again votes the tiers `back`
    times. Votes are decaying shares (`weight` each); LRU order while the LRU share
    exceeds `margin` times the tiers' share. Evicted hashes are remembered for
    `ghosts` pools' worth of evictions. With `gated`, LRU order only while the stale
    rule is on; with `whole`, over the empty and low-value tiers first, then all
    cached data whichever tier is lowest."""
    class LruVote(Reference):
        def __init__(self, blocks=()):
            super().__init__(blocks)
            self._v_marks = {}  # free block -> (access clock, blocks free) at release
            self._v_ghosts = OrderedDict()  # evicted hash -> the same + taken as hit data
            self.evicted = self._v_ghosts  # the pool reports them when computed again
            self._v_access = 0
            self._v_lru = self._v_tiers = 0.0
            self._v_from_hit = set()

        def _now(self):
            return self._v_access if access else self._clock

        def _lru_order(self):
            return self._v_lru > margin * self._v_tiers

        def _v_vote(self, lru, n=1.0):
            self._v_lru *= 1 - weight
            self._v_tiers *= 1 - weight
            if lru:
                self._v_lru += weight * n
            else:
                self._v_tiers += weight * n

        def add_free(self, blocks):
            blocks = list(blocks)
            mark = (self._now(), self._num_free)
            for b in blocks:
                self._v_marks[b] = mark
            super().add_free(blocks)

        def remove_blocks(self, blocks):
            now = self._now()
            for b in blocks:
                rel = self._v_marks.pop(b, None)
                if rel is not None and b.block_hash is not None and b.queue_slot >= FRESH \
                        and now - rel[0] >= rel[1]:
                    self._v_vote(lru=False)  # a hit LRU would have missed
            super().remove_blocks(blocks)
            self._v_access += len(blocks)

        def take(self, num_blocks):
            lru = self._lru_order()
            if lru and whole:
                out = _take_all_lru(self, num_blocks, self._v_from_hit)
            elif lru and not gated and self._returns < self._return_gate:
                out = self._take_lru_order(num_blocks)
            else:
                out = super().take(num_blocks)
            self._v_access += len(out)
            ghosts, from_hit = self._v_ghosts, self._v_from_hit
            for b in out:
                rel = self._v_marks.pop(b, None)
                if rel is not None and b.block_hash is not None:
                    ghosts[b.block_hash] = rel + (b in from_hit,)
                    ghosts.move_to_end(b.block_hash)
            from_hit.clear()
            while len(ghosts) > ghosts_limit(self):
                ghosts.popitem(last=False)
            return out

        def _take_lru_order(self, num_blocks):
            """`take` with the never-hit tier taken in LRU order (the stale rule's off)."""
            tiers, out = self._tiers, []
            while len(out) < num_blocks:
                t = next(i for i, tier in enumerate(tiers) if tier)
                if t == FRESH:
                    take_by_release_clock(self, out, 1, hits_into(self._v_from_hit))
                    continue
                block = tiers[t].popitem(last=t == 0)[0]  # the empty tier is a stack
                block.queue_slot = -1
                out.append(block)
            self._num_free -= len(out)
            self._clock += len(out)
            return out

        def _take_fresh(self, out, num_blocks):
            if self._lru_order():
                take_by_release_clock(self, out, num_blocks,
                                      hits_into(self._v_from_hit))
            else:
                super()._take_fresh(out, num_blocks)

        def recomputed(self, block_hash):
            if block_hash in self._ghosts:  # the base's memory (it never votes)
                super().recomputed(block_hash)
            elif block_hash in self._watched:
                del self._watched[block_hash]
                self._returns += self._return_weight
            rel = self._v_ghosts.pop(block_hash, None)
            if rel is None:
                return
            if rel[2]:
                if back:
                    self._v_vote(lru=False, n=back)  # hit data LRU order dropped came back
            elif self._now() - rel[0] < rel[1]:
                self._v_vote(lru=True)  # LRU would still have held it

    def ghosts_limit(policy):
        return ghosts * policy._watch_limit
    return LruVote


def _take_all_lru(policy, num_blocks, from_hit):
    """Empty and low-value blocks first, then least recently released first over all
    cached data (never hit, hit once, hit often)."""
    tiers, out = policy._tiers, []
    while len(out) < num_blocks:
        for t in (0, 1):  # EMPTY, LOW (kept as stack / queue)
            if tiers[t]:
                block = tiers[t].popitem(last=t == 0)[0]
                block.queue_slot = -1
                out.append(block)
                break
        else:
            if not any(tiers[t] for t in (FRESH, HIT_ONCE, HIT_OFTEN)):
                break  # only kept blocks left: the tiers' own order
            best, best_t = None, None
            for t in (FRESH, HIT_ONCE, HIT_OFTEN):
                tier = tiers[t]
                if tier and (best is None or tier[next(iter(tier))] < best):
                    best, best_t = tier[next(iter(tier))], t
            block = tiers[best_t].popitem(last=False)[0]
            block.queue_slot = -1
            out.append(block)
            if best_t == FRESH:
                policy._evicted_fresh([block])
            else:
                from_hit.add(block)
    policy._num_free -= len(out)
    policy._clock += len(out)
    if len(out) < num_blocks:
        out += HybridTiers.take(policy, num_blocks - len(out))
    return out


EXPERIMENTS = {
    "ghost_age": ghost_age(),
    "lru_vote_gated": lru_vote(weight=1 / 256, back=0, ghosts=2, gated=True),
    "lru_vote_taken": lru_vote(weight=1 / 256, back=0, ghosts=2, gated=True, access=False),
    "lru_vote_ungated": lru_vote(weight=1 / 256, back=0, ghosts=2),
    "lru_vote_m025": lru_vote(margin=0.25, back=0, ghosts=2),
    "lru_vote_whole": lru_vote(margin=0.25, back=0, ghosts=2, whole=True),
    "lru_vote": lru_vote(),
}
for _name, _cls in EXPERIMENTS.items():
    register_eviction_policy(_name, _cls)
