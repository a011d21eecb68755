"""Candidate eviction rules measured on the policy grid and not kept.

The fourth round of docs/eviction-experiments.md (agent loops against
multi-turn), as policies built on the Python reference of `hybrid`
(`HybridTiers`). Register them on the grid with this file:

    python benchmarks/bench_policy_grid.py --out DIR --plugin benchmarks/policy_experiments.py \
        --policies lru,hybrid,lru_while_dead,mean_dev --shapes agent_loop,multi_turn

Each factory's arguments are the parameter the table's ranges were taken over.
`Reference` and the variants run `hybrid` as it was in that round: its rules with
the LRU votes of the fifth round off (`VOTE_WEIGHT` 0 never lets LRU order win);
`reference_now` is `hybrid` as in use.
"""

from __future__ import annotations

from hybridkv.kv_cache.eviction import EvictionPolicy, register_eviction_policy
from hybridkv.kv_cache.eviction import hybrid as H
from hybridkv.kv_cache.eviction.base import JUNCTION, LOW_VALUE, PROTECTED
from hybridkv.kv_cache.eviction.hybrid import FRESH, HIT_OFTEN, HIT_ONCE, HybridTiers

RULES_NOW = (H.AGE_EVERY, H.STALE_AGE, H.REUSE_DECAY, H.RETURN_GATE, H.RETURN_WEIGHT,
             H.VOTE_WEIGHT, H.VOTE_BACK, H.GHOST_POOLS)
RULES = RULES_NOW[:5] + (0.0, 0.0, H.GHOST_POOLS)  # no LRU votes (before the fifth round)


class ReleaseClockOrder:
    """LRU order as `hybrid` had it before the eighth round (the earlier rounds' plugins
    are built on it, so their figures still come out): the bottom of the never-hit stack
    against the fronts of the hit tiers, compared by the clock at their release."""

    def _oldest_tier(self):
        """Of the bottom of the never-hit stack (not empty) and the fronts of the hit
        tiers, the tier of the block released first (ties: the never-hit one)."""
        tiers = self._tiers
        fresh = tiers[FRESH]
        best, best_t = fresh[next(iter(fresh))], FRESH
        for t in (HIT_ONCE, HIT_OFTEN):
            tier = tiers[t]
            if tier and tier[next(iter(tier))] < best:
                best, best_t = tier[next(iter(tier))], t
        return best_t

    def _take_lru(self, out, num_blocks):
        take_by_release_clock(self, out, num_blocks, hits_into(self._from_hit))


def hits_into(blocks):
    """A `taken` callback for take_by_release_clock: hit blocks taken go into `blocks`."""
    def taken(block, t):
        if t != FRESH:
            blocks.add(block)
    return taken


def take_by_release_clock(policy, out, num_blocks, taken):
    """Least recently released first by the release clock, over the never-hit bottom
    and both hit tiers; `taken(block, tier)` sees each block as it leaves its tier."""
    tiers, fresh = policy._tiers, policy._tiers[FRESH]
    while num_blocks and fresh:
        best_t = policy._oldest_tier()
        block = tiers[best_t].popitem(last=False)[0]
        taken(block, best_t)
        if best_t == FRESH:
            policy._evicted_fresh([block])
        block.queue_slot = -1
        out.append(block)
        num_blocks -= 1


class Reference(ReleaseClockOrder, HybridTiers, EvictionPolicy):
    """`hybrid` in Python (without the LRU votes), with hooks for the variants below."""

    uses_hints = True
    rules = RULES

    def __init__(self, blocks=()):
        super().__init__(blocks, self.rules)

    def _stale_span(self, block):
        """How long hit data waits before it counts as stale (in blocks taken)."""
        return self._stale_age * self._reuse

    def _take_fresh(self, out, num_blocks):
        tiers, fresh = self._tiers, self._tiers[FRESH]
        now = self._clock + len(out)
        while num_blocks and fresh:
            for t in (HIT_ONCE, HIT_OFTEN):
                tier = tiers[t]
                if tier:
                    front = next(iter(tier))
                    if tier[front] < now - self._stale_span(front):
                        block = tier.popitem(last=False)[0]
                        self._hit_evicted(block)
                        break
            else:
                bottom_stale = fresh[next(iter(fresh))] < now - self._stale_age * self._reuse
                block = fresh.popitem(last=not bottom_stale)[0]
                self._evicted_fresh([block])
            block.queue_slot = -1
            out.append(block)
            num_blocks -= 1
            now += 1

    def _hit_evicted(self, block):
        """A hit block was taken as stale."""

    def _watch_hit(self, block):
        """Watch an evicted hit block, to see whether its data comes back."""
        if block.block_hash is not None:
            self._watched[block.block_hash] = True
            while len(self._watched) > self._watch_limit:
                self._watched.popitem(last=False)

    def recomputed(self, block_hash):
        if self._watched.get(block_hash):  # hit data a variant watches
            del self._watched[block_hash]
            self._hit_returned()
        super().recomputed(block_hash)

    def _hit_returned(self):
        pass


def adaptive_age(floor=1.0, step=0.02, target=0.05):
    """The stale age falls with each stale eviction and rises when one comes back."""
    class AdaptiveAge(Reference):
        def _hit_evicted(self, block):
            self._stale_age = max(floor, self._stale_age - step * target)
            self._watch_hit(block)

        def _hit_returned(self):
            self._stale_age = min(3.0, self._stale_age + step)
    return AdaptiveAge


def mean_dev(k=4.0, gain=0.125):
    """Reuse distance as a running mean plus k mean deviations (per hit)."""
    class MeanDev(Reference):
        _mean = _dev = 0.0

        def remove_blocks(self, blocks):
            d = _hit_distance(self, blocks)
            super().remove_blocks(blocks)
            if d:
                if not self._mean:
                    self._mean, self._dev = d, d / 2
                else:
                    self._dev += gain * (abs(d - self._mean) - self._dev)
                    self._mean += gain * (d - self._mean)

        def _stale_span(self, block):
            return self._mean + k * self._dev
    return MeanDev


def lru_while_dead(weight=1 / 64, gate=0.05):
    """While the stale rule is on, least recently used first over the never-hit bottom
    and both hit tiers, until a share `gate` of those hit evictions comes back."""
    class LruWhileDead(Reference):
        _hit_share = 0.0

        def _take_fresh(self, out, num_blocks):
            if self._hit_share >= gate:
                return super()._take_fresh(out, num_blocks)
            take_by_release_clock(self, out, num_blocks, self._taken)

        def _taken(self, block, t):
            if t != FRESH:
                self._hit_share *= 1 - weight
                self._watch_hit(block)

        def _hit_returned(self):
            self._hit_share += weight
    return LruWhileDead


class OftenBeforeOnce(Reference):
    """While the stale rule is on, stale hit-often data goes before hit-once data too."""

    def take(self, num_blocks):
        out, tiers = [], self._tiers
        while len(out) < num_blocks:
            lowest = next(t for t, tier in enumerate(tiers) if tier)
            often = tiers[HIT_OFTEN]
            stale = self._returns >= self._return_gate and self._reuse > 0
            if lowest == HIT_ONCE and stale and often and \
                    often[next(iter(often))] < self._clock - self._stale_age * self._reuse:
                block = often.popitem(last=False)[0]
                block.queue_slot = -1
                self._num_free -= 1
                self._clock += 1
                out.append(block)
            else:
                out += super().take(1)
        return out


class GateZero(Reference):
    """The stale rule always on."""

    rules = RULES[:3] + (0.0,) + RULES[4:]


class StartsOn(Reference):
    """The share of fresh evictions coming back starts at 0.1 (the gate) instead of 0."""

    def __init__(self, blocks=()):
        super().__init__(blocks)
        self._returns = 0.1


def _hit_distance(policy, blocks):
    """The longest wait (blocks taken since release) among hit blocks leaving the queue."""
    tiers, clock, d = policy._tiers, policy._clock, 0
    for block in blocks:
        slot = block.queue_slot
        if FRESH <= slot <= HIT_OFTEN and block.value_hint != JUNCTION:
            d = max(d, clock - tiers[slot][block])
    return d


def _as_hit_once(policy, keep):
    """Queue never-hit blocks as hit once (the back of the tier, the tail last)."""
    clock, tier = policy._clock, policy._tiers[HIT_ONCE]
    for i, b in enumerate(keep):  # released as add_free would (the LRU votes' marks)
        policy._marks[b] = policy._lru.release(policy._num_free + i, False)
    for b in reversed(keep):
        b.queue_slot = HIT_ONCE
        tier[b] = clock
    policy._num_free += len(keep)


def _keepable(b):
    return b.block_hash is not None and not b.num_hits and b.value_hint not in (LOW_VALUE,
                                                                               PROTECTED)


class RecomputedHitOnce(Reference):
    """Fresh data computed again after its eviction is released as hit once."""

    def __init__(self, blocks=()):
        super().__init__(blocks)
        self._back = set()

    def recomputed(self, block_hash):
        super().recomputed(block_hash)
        self._back.add(block_hash)

    def add_free(self, blocks):
        blocks = list(blocks)
        keep = [b for b in blocks if b.block_hash in self._back and _keepable(b)]
        if not keep:
            return super().add_free(blocks)
        self._back.difference_update(b.block_hash for b in keep)
        rest = [b for b in blocks if b not in set(keep)]
        if rest:
            super().add_free(rest)
        _as_hit_once(self, keep)


def continuation(ratio=0.25, accessed=False):
    """A request whose hit ends at a never-hit block (the previous request's end) after
    a reuse distance under `ratio` x the pool: the new data it releases is queued as
    hit once. Distance in blocks taken, or (`accessed`) in blocks taken and hit, for
    the blocks the request takes right after its hit."""
    class Continuation(Reference):
        def __init__(self, blocks=()):
            super().__init__(blocks)
            self._marked, self._pending, self._access, self._released = set(), 0, 0, {}
            self._pool = self._watch_limit

        def take(self, num_blocks):
            out = super().take(num_blocks)
            self._access += len(out)
            for b in out:
                self._released.pop(b, None)
            if accessed and self._pending:
                self._pending -= 1
                self._marked.update(out)
            else:
                self._marked.difference_update(out)
            return out

        def remove_blocks(self, blocks):
            if accessed:
                d = 0
                for b in blocks:
                    r = self._released.pop(b, None)
                    if r is not None and FRESH <= b.queue_slot <= HIT_OFTEN \
                            and b.value_hint != JUNCTION:
                        d = max(d, self._access - r)
            else:
                d = _hit_distance(self, blocks)
            cont = blocks[-1].queue_slot == FRESH
            super().remove_blocks(blocks)
            self._access += len(blocks)
            if cont and d < ratio * self._pool:
                if accessed:
                    self._pending = 2
                else:
                    self._marked.add(blocks[-1])
            elif accessed and not cont:
                self._pending = 0

        def add_free(self, blocks):
            blocks = list(blocks)
            for b in blocks:
                self._released[b] = self._access
            marked = self._marked
            if accessed:
                keep = [b for b in blocks if b in marked and _keepable(b)]
            else:
                keep = [b for b in blocks if _keepable(b)] \
                    if any(b in marked for b in blocks) else []
            marked.difference_update(blocks)
            if not keep:
                return super().add_free(blocks)
            rest = [b for b in blocks if b not in set(keep)]
            if rest:
                super().add_free(rest)
            _as_hit_once(self, keep)

        def uncache(self, block):
            self._marked.discard(block)
            super().uncache(block)
    return Continuation


def access_gate(ratio=1.0, lru=False):
    """Fresh evictions count as coming back only within `ratio` x the pool of blocks
    taken and hit since; with `lru`, least recently used first behind that gate."""
    base = lru_while_dead() if lru else Reference

    class AccessGate(base):
        def __init__(self, blocks=()):
            super().__init__(blocks)
            self._access, self._when = 0, {}

        def take(self, num_blocks):
            out = super().take(num_blocks)
            self._access += len(out)
            return out

        def remove_blocks(self, blocks):
            super().remove_blocks(blocks)
            self._access += len(blocks)

        def _evicted_fresh(self, blocks):
            super()._evicted_fresh(blocks)
            for b in blocks:
                if b.block_hash is not None:
                    self._when[b.block_hash] = self._access

        def recomputed(self, block_hash):
            when = self._when.pop(block_hash, None)
            if when is not None and self._access - when >= ratio * self._watch_limit:
                self._watched.pop(block_hash, None)  # came back too late to count
                self._ghosts.pop(block_hash, None)
                return
            super().recomputed(block_hash)
    return AccessGate


def own_reuse(factor=2.0):
    """Hit data is stale after `factor` x its own last reuse distance."""
    class OwnReuse(Reference):
        def __init__(self, blocks=()):
            super().__init__(blocks)
            self._own = {}

        def remove_blocks(self, blocks):
            tiers, clock = self._tiers, self._clock
            for b in blocks:
                if FRESH <= b.queue_slot <= HIT_OFTEN and b.value_hint != JUNCTION:
                    self._own[b] = clock - tiers[b.queue_slot][b]
            super().remove_blocks(blocks)

        def _stale_span(self, block):
            own = self._own.get(block)
            return super()._stale_span(block) if own is None else factor * own
    return OwnReuse


class ReferenceNow(Reference):
    """`hybrid` as in use (with the LRU votes)."""

    rules = RULES_NOW


EXPERIMENTS = {
    "reference": Reference,
    "reference_now": ReferenceNow,
    "adaptive_age": adaptive_age(),
    "mean_dev": mean_dev(),
    "lru_while_dead": lru_while_dead(),
    "often_before_once": OftenBeforeOnce,
    "gate_zero": GateZero,
    "recomputed_hit_once": RecomputedHitOnce,
    "continuation": continuation(),
    "continuation_accessed": continuation(0.3, accessed=True),
    "starts_on": StartsOn,
    "access_gate": access_gate(),
    "access_gate_lru": access_gate(lru=True),
    "own_reuse": own_reuse(),
}
for _name, _cls in EXPERIMENTS.items():
    register_eviction_policy(_name, _cls)
