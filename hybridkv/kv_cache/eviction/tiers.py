"""`tiered`: the default policy, six tiers on its C core (`HybridCore`); `hybrid`
(five rules) replaces it as the default once it has a C twin of its own.

Free blocks sit in tiers; a block is taken from the lowest non-empty tier:

0. blocks holding no cached data;
1. cached blocks their group rated low value when it released them
   (`Block.value_hint`: a sliding-window block outside every window a likely
   hit needs, a Mamba state at a boundary no likely hit stops at);
2. cached blocks never hit since they were stored, the most recently
   released request first (tail first within it). Data nobody reused yet
   goes before data that proved useful, and under cyclic access (round-robin
   sessions larger than the pool) the oldest sessions stay whole instead of
   each one being evicted just before its turn, as under LRU;
3. cached blocks hit once, least recently used first;
4. cached blocks hit twice or more, least recently used first;
5. cached blocks a running request still needs kept (`PROTECTED`: a window
   its group left behind that completes a prefix the request still holds),
   least recently released first; when the request ends its group rates
   them again and they move to their tier.

A block its group rated a junction (the window or state a hit needs where
requests sharing a prefix diverge) counts as hit once more: the full
prefix before it was just reused, and it completes that reusable unit.

Aging: every AGE_EVERY blocks taken for new data from tier 2 move the
least recently used block of tier 4 down to tier 3 and that of tier 3 to
the back of tier 2, so data that stops being hit drifts down and new popular
data can take its place (slowly: a burst of new data must not wash out what
is still being reused). A hit takes a block out of the queue; on release it
re-enters by its hit count.

Stale hit data: hit counts say a block was useful, not that it still is (an
agent that finished, a conversation that ended). The policy keeps the longest
recent reuse distance of hits (blocks taken between a block's release and its
hit, a maximum that decays by REUSE_DECAY per hit, whatever its length; hits
on junction-rated blocks do not count: they come when a new prefix branches
off, on a clock of their own) and watches whether fresh data it evicts is
computed again. While at least RETURN_GATE of recent fresh
evictions come back (the never-hit tier is losing live data, e.g. the newest
step of agents that run round-robin in a pool that holds them all), a hit
block unused for more than STALE_AGE times that distance is taken before the
never-hit tier, and so is the bottom of the never-hit stack (the oldest
releases and the data aging moved there) when it was released that long ago.
When fresh evictions do not come back (unique questions, a cycle larger than
the pool) nothing changes.

Least recently used first, when that would have kept more: the policy
remembers every evicted hash for GHOST_POOLS pools' worth of evictions and
asks what one LRU queue would have done: where the block would stand in that
queue (`LruPositions`: released with f blocks free ahead of it, less the
blocks taken since, plus the empty blocks released since, less the hits on
blocks released before it), so whether LRU would still hold it. Evicted data
computed again that LRU would still have held votes for LRU order (a running agent's newest
step, evicted while finished agents' older context stays); a hit on data LRU
would have dropped votes for the tiers (the oldest multi-turn sessions kept
whole), and so, VOTE_BACK times, does hit data taken in LRU order that is
computed again. Each vote is a decaying share (VOTE_WEIGHT). While LRU's share
is larger, the never-hit tier, when it is the lowest left, is taken together with
both hit tiers in LRU's own order: the policy keeps its cached free blocks in one
more list, in the order they were released (a release's tail first, as given),
and takes from its front. A block queued again because its rating changed keeps
its place there, as under LRU; a block kept for a running request that reaches
the front is passed over and, once its rating changes, goes back to the front.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from hybridkv.kv_cache.eviction.base import JUNCTION, LOW_VALUE, PROTECTED, EvictionPolicy
from hybridkv.kv_cache.eviction.lru_positions import LruPositions
from hybridkv.kv_cache.fastpath import native

if TYPE_CHECKING:
    from hybridkv.kv_cache.block_pool import Block

# the tiers, in the order they are taken from (indexes into HybridPolicy._tiers)
EMPTY, LOW, FRESH, HIT_ONCE, HIT_OFTEN, KEPT = range(6)
AGE_EVERY = 8
# stale hit data (see above): age limit in reuse distances, decay of the longest
# reuse distance per hit, the share of fresh evictions coming back that turns the
# rule on, and the weight of one eviction in that share
STALE_AGE = 1.5
REUSE_DECAY = 0.999
RETURN_GATE = 0.1
RETURN_WEIGHT = 1 / 256
# LRU order while it would have kept more (see above): the weight of one vote, the
# votes of hit data taken in LRU order that comes back, pools' worth of evicted
# hashes remembered
VOTE_WEIGHT = 1 / 64
VOTE_BACK = 4.0
GHOST_POOLS = 4


class TierRules(NamedTuple):
    """The tiered policy's constants, named; `HybridCore` (C) parses the same
    structure in this field order, so this is their one source."""

    age_every: int = AGE_EVERY
    stale_age: float = STALE_AGE
    reuse_decay: float = REUSE_DECAY
    return_gate: float = RETURN_GATE
    return_weight: float = RETURN_WEIGHT
    vote_weight: float = VOTE_WEIGHT
    vote_back: float = VOTE_BACK
    ghost_pools: int = GHOST_POOLS


TIER_RULES = TierRules()
# tiers kept as stacks (the end of the dict is taken first: new blocks go on top);
# the others are queues (the front is taken first, new blocks join at the end)
STACKS = (EMPTY, FRESH)


def lru_capacity(ghost_pools: int, pool: int) -> int:
    """The release numbers LruPositions keeps (a power of two): every block free or
    remembered as evicted was released within about that many releases."""
    need = (ghost_pools + 2) * pool
    return 1 << max(need - 1, 1).bit_length()


def tier_of(block: Block) -> int:
    """A released block's tier: empty if it caches nothing; kept if protected; low if
    rated low value and never hit (data that was hit proved its value whatever the
    rating); else by hits, a junction rating counting as one more."""
    if block.block_hash is None:
        return EMPTY
    hits, rating = block.num_hits, block.value_hint
    if rating == PROTECTED:
        return KEPT
    if rating == LOW_VALUE and not hits:
        return LOW
    hits += rating == JUNCTION
    return FRESH if not hits else HIT_ONCE if hits == 1 else HIT_OFTEN


class HybridTiers:
    """The tiers and rules of `HybridPolicy` in Python: the reference that the C
    extension's `HybridCore` (`_native/_fp_hybrid*.c`) matches decision for decision
    (it runs when built, with the same constants; `HYBRIDKV_DISABLE_FASTPATH=1` runs
    this). A rule changed here must be changed there too: tests/kv_cache/
    test_hybrid_tiers.py and the replay digests compare the two.

    A free block's tier is kept in `Block.queue_slot` (-1 when not free); its
    entry in the tier holds the clock (blocks taken so far) at its release.
    """

    evicted: Mapping[bytes, object]

    def __init__(self, blocks: Iterable[Block], rules: TierRules) -> None:
        # the constants given when the policy was made (tests change them)
        self._age_every, self._stale_age = rules.age_every, rules.stale_age
        self._reuse_decay, self._return_gate = rules.reuse_decay, rules.return_gate
        self._return_weight, self._vote_weight = rules.return_weight, rules.vote_weight
        self._vote_back, self._ghost_pools = rules.vote_back, rules.ghost_pools
        self._tiers: list[OrderedDict[Block, int]] = [OrderedDict() for _ in range(6)]
        self._num_taken = 0  # never-hit data evicted (drives aging)
        self._clock = 0  # blocks taken
        self._reuse = 0.0  # the longest recent reuse distance of hits
        self._returns = 0.0  # share of recent fresh evictions computed again
        self._watched: OrderedDict[bytes, None] = OrderedDict()  # fresh evictions watched
        self._lru_share = self._tier_share = 0.0  # votes for LRU order and for the tiers
        # a free block's release mark in one LRU queue (LruPositions); every evicted
        # hash's (the same, and whether it was hit data taken in LRU order)
        self._marks: dict[Block, tuple[int, int]] = {}
        self._from_hit: set[Block] = set()  # hit blocks taken in LRU order (in a take)
        self._ghosts: OrderedDict[bytes, tuple[int, int, bool]] = OrderedDict()
        self.evicted = self._ghosts
        # cached free blocks in LRU's order (front: released first); kept blocks an
        # LRU-order take passed over are out of it, parked, until their rating changes
        self._order: OrderedDict[Block, None] = OrderedDict()
        self._parked: set[Block] = set()
        initial = list(blocks)
        for block in reversed(initial):  # a stack: the first given on top
            self._tiers[EMPTY][block] = 0
            self._marks[block] = (0, 0)
            block.queue_slot = EMPTY
        self._num_free = len(initial)
        self._watch_limit = max(len(initial), 1)
        self._lru = LruPositions(lru_capacity(self._ghost_pools, self._watch_limit))

    def __len__(self) -> int:
        return self._num_free

    def __iter__(self) -> Iterator[Block]:
        for t, tier in enumerate(self._tiers):
            yield from reversed(tier) if t in STACKS else tier

    def __contains__(self, block: Block) -> bool:
        return block.queue_slot >= 0 and block in self._tiers[block.queue_slot]

    def add_free(self, blocks: Iterable[Block]) -> None:
        fresh, unparked = [], []
        tiers, clock, order, parked = self._tiers, self._clock, self._order, self._parked
        count, release, free = 0, self._lru.release, self._num_free
        for block in blocks:
            self._marks[block] = release(free + count, block.block_hash is None)
            count += 1
            if block in parked:  # every block released before it is gone: the front
                parked.remove(block)
                unparked.append(block)
            elif block.block_hash is not None and block not in order:  # (in it: queued again)
                order[block] = None
            t = tier_of(block)
            block.queue_slot = t
            if t == FRESH:
                fresh.append(block)
            else:
                tiers[t][block] = clock
        self._num_free += count
        stack = tiers[FRESH]
        for block in reversed(fresh):  # the whole release goes first, its tail first
            stack[block] = clock
        for block in reversed(unparked):
            order[block] = None
            order.move_to_end(block, last=False)

    def remove(self, block: Block) -> None:
        self.remove_blocks((block,))

    def remove_blocks(self, blocks: Sequence[Block]) -> None:
        tiers, clock, marks, lru = self._tiers, self._clock, self._marks, self._lru
        order, parked = self._order, self._parked
        reuse = self._reuse * self._reuse_decay  # one hit, however many blocks
        for block in blocks:  # where LRU would have had them when the hit came
            if block.block_hash is not None and block.queue_slot >= FRESH \
                    and lru.position(marks[block]) < 0:
                self._vote(False, 1.0)  # a hit LRU would have missed
        for block in blocks:
            if block.ref_cnt:  # held again (an unheld block is only being queued anew)
                order.pop(block, None)
                parked.discard(block)
            slot = block.queue_slot
            lru.hit(marks.pop(block)[0])
            released = tiers[slot].pop(block)
            block.queue_slot = -1
            if FRESH <= slot <= HIT_OFTEN and clock - released > reuse \
                    and block.value_hint != JUNCTION:  # how long it waited
                reuse = clock - released
        self._reuse = reuse
        self._num_free -= len(blocks)

    def take(self, num_blocks: int) -> list[Block]:
        out = self._take(num_blocks)
        ghosts, marks, from_hit = self._ghosts, self._marks, self._from_hit
        order, parked = self._order, self._parked
        for block in out:
            order.pop(block, None)
            parked.discard(block)
            mark = marks.pop(block)
            if block.block_hash is not None:
                ghosts[block.block_hash] = mark + (block in from_hit,)
                ghosts.move_to_end(block.block_hash)
        from_hit.clear()
        while len(ghosts) > self._ghost_pools * self._watch_limit:
            ghosts.popitem(last=False)
        self._lru.taken(len(out))
        return out

    def _take(self, num_blocks: int) -> list[Block]:
        tiers = self._tiers
        lru = self._lru_share > self._tier_share  # LRU order for the never-hit tier
        stale = lru or self._returns >= self._return_gate and self._reuse > 0
        if num_blocks == 1 and not stale:  # the common decode case
            for t, tier in enumerate(tiers):
                if tier:
                    block = tier.popitem(t in STACKS)[0]
                    block.queue_slot = -1
                    self._num_free -= 1
                    self._clock += 1
                    if t == FRESH:
                        self._evicted_fresh([block])
                    return [block]
        out: list[Block] = []
        while len(out) < num_blocks:  # from the lowest non-empty tier (aging may refill one)
            t = next(i for i, tier in enumerate(tiers) if tier)
            if t == FRESH and stale:
                (self._take_lru if lru else self._take_fresh)(out, num_blocks - len(out))
                continue
            pop, top = tiers[t].popitem, t in STACKS
            taken = [pop(top)[0] for _ in range(min(num_blocks - len(out), len(tiers[t])))]
            for block in taken:
                block.queue_slot = -1
            out += taken
            if t == FRESH:  # only evicting data counts: empty and low-value blocks are no loss
                self._evicted_fresh(taken)
        self._num_free -= len(out)
        self._clock += len(out)
        return out

    def _take_lru(self, out: list[Block], num_blocks: int) -> None:
        """Take up to `num_blocks` never-hit and hit blocks in LRU's order (the front of
        `_order`); kept blocks met at the front are parked."""
        tiers, order, fresh = self._tiers, self._order, self._tiers[FRESH]
        while num_blocks and fresh:
            block = next(iter(order))
            del order[block]
            t = block.queue_slot
            if t < 0:  # taken out of its tier and not queued again
                continue
            if not FRESH <= t <= HIT_OFTEN:  # kept for a running request
                self._parked.add(block)
                continue
            del tiers[t][block]
            if t == FRESH:
                self._evicted_fresh([block])
            else:
                self._from_hit.add(block)
            block.queue_slot = -1
            out.append(block)
            num_blocks -= 1

    def _take_fresh(self, out: list[Block], num_blocks: int) -> None:
        """Take up to `num_blocks` from the never-hit tier, or stale hit blocks before them;
        within the tier, the bottom of the stack first while it is stale too."""
        tiers, fresh = self._tiers, self._tiers[FRESH]
        limit = self._clock + len(out) - self._stale_age * self._reuse
        while num_blocks and fresh:
            for t in (HIT_ONCE, HIT_OFTEN):
                tier = tiers[t]
                if tier and tier[next(iter(tier))] < limit:  # unused for too long
                    block = tier.popitem(last=False)[0]
                    break
            else:  # the newest release first, unless the bottom of the stack is as stale
                block = fresh.popitem(last=fresh[next(iter(fresh))] >= limit)[0]
                self._evicted_fresh([block])
            block.queue_slot = -1
            out.append(block)
            num_blocks -= 1
            limit += 1

    def _evicted_fresh(self, blocks: list[Block]) -> None:
        """Count never-hit data evicted (aging; the share that comes back)."""
        before = self._num_taken
        self._num_taken += len(blocks)
        every = self._age_every
        for _ in range(self._num_taken // every - before // every):
            self._age()
        self._returns *= (1 - self._return_weight) ** len(blocks)
        watched = self._watched
        for block in blocks:
            if block.block_hash is not None:
                watched[block.block_hash] = None
        while len(watched) > self._watch_limit:
            watched.popitem(last=False)

    def recomputed(self, block_hash: bytes) -> None:
        if block_hash in self._watched:
            del self._watched[block_hash]
            self._returns += self._return_weight
        number, base, from_hit = self._ghosts.pop(block_hash)
        if from_hit:
            self._vote(False, self._vote_back)  # hit data LRU order dropped came back
        elif self._lru.position((number, base)) >= 0:
            self._vote(True, 1.0)  # LRU would still have held it

    def _vote(self, lru: bool, count: float) -> None:
        keep = 1 - self._vote_weight
        self._lru_share *= keep
        self._tier_share *= keep
        if lru:
            self._lru_share += self._vote_weight * count
        else:
            self._tier_share += self._vote_weight * count

    def _age(self) -> None:
        """Move the least recently used block of each hit tier one tier down."""
        tiers = self._tiers
        for t in (HIT_ONCE, HIT_OFTEN):
            if tiers[t]:
                block, released = tiers[t].popitem(last=False)
                below = tiers[t - 1]
                below[block] = released  # the back of the tier below: taken last there
                if t - 1 in STACKS:
                    below.move_to_end(block, last=False)
                block.queue_slot = t - 1

    def hint_changed(self, block: Block) -> None:
        # not a hit: no reuse distance, no vote; not a release: LRU keeps it where it is
        del self._tiers[block.queue_slot][block]
        block.queue_slot = t = tier_of(block)
        self._tiers[t][block] = self._clock
        if t != KEPT and block in self._parked:
            self._parked.remove(block)
            self._order[block] = None
            self._order.move_to_end(block, last=False)

    def uncache(self, block: Block) -> None:
        self._lru.to_front(self._marks[block][0])
        self._order.pop(block, None)
        self._parked.discard(block)
        released = self._tiers[block.queue_slot].pop(block)
        self._tiers[EMPTY][block] = released  # on top: reused first
        block.queue_slot = EMPTY


if TYPE_CHECKING:
    TiersBase = HybridTiers
else:  # the C tiers when built, else the Python reference
    TiersBase = native.HybridCore if native is not None else HybridTiers


class TieredPolicy(TiersBase, EvictionPolicy):
    """Tiered free queue: empty, low value, fresh (newest first), hit once, hit often,
    kept for a running request (the rules: this module's docstring)."""

    uses_hints = True

    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        super().__init__(blocks, TIER_RULES)
