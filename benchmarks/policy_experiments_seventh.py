"""Seventh-round candidate rules, on the rules of the build with the junction
premium only where prompts branch (`docs/eviction.md`).

Each policy is `hybrid`'s Python reference (`HybridTiers`) with one change;
`hybrid_py` is `hybrid` as it was then (LRU order by release clocks,
`ReleaseClockOrder`, as before the eighth round):

- `lru_history`, `lru_history_hits`, `lru_history_returns`: the LRU queue the votes
  ask about follows LRU's own history where the two orders part. A hit on a block
  LRU would already have taken (position < 0) records no hit (LRU's front passed
  it already) and one block taken (LRU computes that data again); evicted data
  computed again that LRU would still have held records a hit on its release and
  one block taken fewer (both, or one of the two);
- `votes_fresh`, `votes_fresh_once`, `votes_no_junction`: only hits on never-hit
  blocks (or never-hit and hit-once blocks) vote for the tiers; hits on blocks
  rated a junction do not vote;
- `back_checked_none`, `back_checked_lru`: hit data taken in LRU order that comes
  back votes for the tiers only when one LRU queue would not still have held it
  either; else no vote, or a vote for LRU order;
- `tiers_lru_order`: LRU order for the never-hit and hit tiers from the start,
  votes ignored (what the other tiers and the ratings cost under LRU order);
- `no_junction_premium`: a junction rating adds no hit anywhere.

    python benchmarks/bench_policy_grid.py --out DIR \\
        --plugin benchmarks/policy_experiments_seventh.py \\
        --policies lru,hybrid,lru_history,votes_fresh

Results: docs/eviction-experiments.md, "Seventh round".
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from policy_experiments import ReleaseClockOrder  # noqa: E402

from hybridkv.kv_cache.eviction import hybrid as H  # noqa: E402
from hybridkv.kv_cache.eviction import register_eviction_policy  # noqa: E402
from hybridkv.kv_cache.eviction.base import EvictionPolicy  # noqa: E402


def history(missed_hits: bool = True, returned: bool = True, vote_tiers=None,
            junction_votes: bool = True):
    """`hybrid` whose LRU queue follows LRU's history:

    - `missed_hits`: a hit on a block LRU would have taken records no hit in the
      queue, and one block taken (LRU computes that data again);
    - `returned`: evicted data computed again that LRU would still have held
      records a hit on its release, and one block taken fewer;
    - `vote_tiers`: the tiers whose hits LRU would have missed vote (None: all);
    - `junction_votes=False`: hits on junction-rated blocks do not vote.
    """
    class History(ReleaseClockOrder, H.HybridTiers, EvictionPolicy):
        uses_hints = True

        def __init__(self, blocks=()):
            super().__init__(blocks, (
                H.AGE_EVERY, H.STALE_AGE, H.REUSE_DECAY, H.RETURN_GATE, H.RETURN_WEIGHT,
                H.VOTE_WEIGHT, H.VOTE_BACK, H.GHOST_POOLS))

        def remove_blocks(self, blocks):
            if vote_tiers is not None or not junction_votes:
                marks = self._marks
                for block in blocks:
                    if block.block_hash is not None and block.queue_slot >= H.FRESH and (
                            vote_tiers is not None and block.queue_slot not in vote_tiers
                            or not junction_votes and block.value_hint == H.JUNCTION):
                        number, base = marks[block]
                        marks[block] = (number, base + 10**12)  # no vote
            if not missed_hits:
                return super().remove_blocks(blocks)
            tiers, clock, marks, lru = self._tiers, self._clock, self._marks, self._lru
            reuse = self._reuse * self._reuse_decay
            missed = 0
            gone = []
            for block in blocks:
                gone.append(block.block_hash is not None and block.queue_slot >= H.FRESH
                            and lru.position(marks[block]) < 0)
            for lost in gone:
                if lost:
                    self._vote(False, 1.0)
            for block, lost in zip(blocks, gone):
                slot = block.queue_slot
                number = marks.pop(block)[0]
                if lost:
                    missed += 1
                else:
                    lru.hit(number)
                released = tiers[slot].pop(block)
                block.queue_slot = -1
                if H.FRESH <= slot <= H.HIT_OFTEN and clock - released > reuse \
                        and block.value_hint != H.JUNCTION:
                    reuse = clock - released
            lru.taken(missed)
            self._reuse = reuse
            self._num_free -= len(blocks)

        def _queue(self, blocks, tier=H.tier_of, kept=None):
            """`add_free` with another tier rule, or with the marks in `kept` for blocks
            that never left the votes' LRU queue (they stand ahead of new releases)."""
            tiers, clock, marks, release = self._tiers, self._clock, self._marks, self._lru.release
            free, count, fresh = self._num_free + len(kept or ()), 0, []
            for block in blocks:
                mark = kept.pop(block, None) if kept else None
                if mark is None:
                    mark = release(free + count, block.block_hash is None)
                    count += 1
                marks[block] = mark
                t = tier(block)
                block.queue_slot = t
                if t == H.FRESH:
                    fresh.append(block)
                else:
                    tiers[t][block] = clock
                self._num_free += 1
            for block in reversed(fresh):  # the whole release goes first, its tail first
                tiers[H.FRESH][block] = clock

        def recomputed(self, block_hash):
            if not returned:
                return super().recomputed(block_hash)
            if block_hash in self._watched:
                del self._watched[block_hash]
                self._returns += self._return_weight
            number, base, from_hit = self._ghosts.pop(block_hash)
            if from_hit:
                self._vote(False, self._vote_back)
            elif self._lru.position((number, base)) >= 0:
                self._vote(True, 1.0)
                self._lru.hit(number)
                self._lru.taken(-1)

    return History


register_eviction_policy("lru_history", history())
register_eviction_policy("lru_history_hits", history(returned=False))
register_eviction_policy("lru_history_returns", history(missed_hits=False))
register_eviction_policy("hybrid_py", history(False, False))
register_eviction_policy("votes_fresh_once", history(False, False, (H.FRESH, H.HIT_ONCE)))
register_eviction_policy("votes_fresh", history(False, False, (H.FRESH,)))
register_eviction_policy("votes_no_junction", history(False, False, None, False))


def always_lru():
    """`hybrid` with LRU order for its never-hit and hit tiers from the start (votes
    ignored): what the rest of the policy (empty, low value, kept tiers) costs."""
    base = history(False, False)

    class AlwaysLru(base):
        def _vote(self, lru, count):
            pass

        def __init__(self, blocks=()):
            super().__init__(blocks)
            self._lru_share = 1.0

    return AlwaysLru


register_eviction_policy("tiers_lru_order", always_lru())


def no_junction_premium():
    """`hybrid` where a junction rating adds no hit (ranked by its hits alone)."""
    base = history(False, False)

    def tier(block):
        t = H.tier_of(block)
        if block.value_hint == H.JUNCTION and t in (H.HIT_ONCE, H.HIT_OFTEN):
            hits = block.num_hits
            return H.FRESH if not hits else H.HIT_ONCE if hits == 1 else H.HIT_OFTEN
        return t

    class NoPremium(base):
        def add_free(self, blocks):
            self._queue(blocks, tier=tier)

        def hint_changed(self, block):
            del self._tiers[block.queue_slot][block]
            block.queue_slot = t = tier(block)
            self._tiers[t][block] = self._clock

    return NoPremium


register_eviction_policy("no_junction_premium", no_junction_premium())


def back_checked(held_vote: bool | None):
    """`hybrid` where hit data taken in LRU order that comes back votes for the tiers
    only when one LRU queue would not still have held it either; when it would have,
    `held_vote` True votes for LRU order, False casts no vote, None keeps the tiers'
    VOTE_BACK votes (the reference)."""
    base = history(False, False)

    class BackChecked(base):
        def recomputed(self, block_hash):
            if block_hash in self._watched:
                del self._watched[block_hash]
                self._returns += self._return_weight
            number, base_, from_hit = self._ghosts.pop(block_hash)
            held = self._lru.position((number, base_)) >= 0
            if from_hit and not (held and held_vote is not None):
                self._vote(False, self._vote_back)
            elif held and (not from_hit or held_vote):
                self._vote(True, 1.0)

    return BackChecked


register_eviction_policy("back_checked_none", back_checked(False))
register_eviction_policy("back_checked_lru", back_checked(True))


def requeue_in_place():
    """`hybrid` where a block queued anew because its rating changed (a request's
    protected windows when it ends: `remove_blocks` on free blocks, then `add_free`)
    keeps its place in the votes' LRU queue: `lru` never moves it, so neither hit nor
    release is recorded, no vote is cast and no reuse distance measured."""
    base = history(False, False)

    class RequeueInPlace(base):
        def __init__(self, blocks=()):
            super().__init__(blocks)
            self._requeued: dict = {}

        def remove_blocks(self, blocks):
            moved = [b for b in blocks if b.ref_cnt == 0]
            if not moved:
                return super().remove_blocks(blocks)
            hits = [b for b in blocks if b.ref_cnt != 0]
            if hits:
                super().remove_blocks(hits)
            for block in moved:
                self._requeued[block] = self._marks.pop(block)
                self._tiers[block.queue_slot].pop(block)
                block.queue_slot = -1
            self._num_free -= len(moved)

        def add_free(self, blocks):
            if not self._requeued:
                return super().add_free(blocks)
            self._queue(blocks, kept=self._requeued)

    return RequeueInPlace


register_eviction_policy("requeue_in_place", requeue_in_place())
