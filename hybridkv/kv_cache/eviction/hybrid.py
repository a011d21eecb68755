"""`hybrid`: the default policy, five rules over five queues.

Free blocks sit in five queues, taken from in this order (docs/eviction.md
states each rule with the measurement that keeps it):

1. **Empty first.** A block holding no cached data goes first.
2. **Low value next.** A cached block its group rated `LOW_VALUE` (a window
   or a Mamba state no likely hit resumes from) that no hit used.
3. **Never-hit before hit, hit data capped.** Cached data no hit used goes
   before data a hit used; the hit queue keeps at most `hit_share` of the
   pool, its least recently used block joining the back of the never-hit
   queue beyond that. Both queues are least recently released (or hit)
   first, a request's blocks tail first; with no hits this is `lru`.
4. **Cycle guard.** While evicted data mostly comes back after LRU would
   have dropped it anyway (requests cycle through more data than the pool
   holds), a release of never-hit data goes to the front of its queue,
   newest release first: the older data stays whole instead of every prefix
   being evicted just before its turn.
5. **Protected last.** A block rated `PROTECTED` (it completes a prefix a
   running request still holds) goes only when nothing else is left; when the
   request ends its group rates it again and it queues with the release.

Rule 4 keeps, for every free block, the number of blocks taken by which one
LRU queue would still hold it (blocks taken so far plus the free blocks ahead
of it at its release; hits and empty blocks since are not counted), and the
same for the hashes of the last `ghost_pools` pools' worth of evicted data.
Evicted data computed again before that point votes for LRU order (the
policy lost what LRU would have kept); a hit on a block kept past it votes
for the guard (the policy kept what LRU would have lost). Each vote is a
decaying share (`vote_weight`); the guard is on unless LRU's share is the
larger, so it starts on and stays on while it does no harm.

The constants live in one named structure, `HybridRules`. `HybridPolicy` here
is the pure-Python reference; a pool whose manager runs the C backend (the
default: built, and `HYBRIDKV_DISABLE_FASTPATH` not `1` when the manager is made)
gets its C twin instead (`for_backend`), the extension's `HybridRulesCore`
(`_native/_fp_rules*.c`), which reads the policy's `rules` by field name and
decides exactly like this code (tests/kv_cache/test_hybrid_twin.py and the replay
digests compare the two); a subclass that redefines a method runs this code. A rule
changed here must be changed there too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hybridkv.kv_cache import fastpath
from hybridkv.kv_cache.eviction.base import LOW_VALUE, PROTECTED, EvictionPolicy

if TYPE_CHECKING:
    from hybridkv.kv_cache.block_pool import Block

# the queues, in the order they are taken from (Block.queue_slot while free)
EMPTY, LOW, FRESH, HIT, KEPT = range(5)


@dataclass(frozen=True)
class HybridRules:
    """The constants of the five rules, and switches that turn rules off (for
    measuring what each one earns; the default has every rule on).

    Raises:
        ValueError: naming the field, for a value out of range.
    """

    hit_share: float = 0.8  # rule 3: the hit queue's largest share of the pool
    vote_weight: float = 1 / 64  # rule 4: the weight of one vote
    ghost_pools: int = 2  # rule 4: pools' worth of evicted hashes remembered
    low_value_first: bool = True  # rule 2
    hits_kept: bool = True  # rule 3
    cycle_guard: bool = True  # rule 4
    protected_last: bool = True  # rule 5

    def __post_init__(self) -> None:
        if not 0.0 <= self.hit_share <= 1.0:
            raise ValueError(f"HybridRules.hit_share must be in [0, 1], got {self.hit_share}")
        if not 0.0 < self.vote_weight < 1.0:
            raise ValueError(f"HybridRules.vote_weight must be in (0, 1), "
                             f"got {self.vote_weight}")
        if self.ghost_pools < 1:
            raise ValueError(f"HybridRules.ghost_pools must be >= 1, got {self.ghost_pools}")


RULES = HybridRules()


def queue_of(block: Block, rules: HybridRules = RULES) -> int:
    """The queue a free block belongs in (the rules' numbering above)."""
    if block.block_hash is None:
        return EMPTY
    rating = block.value_hint
    if rating == PROTECTED and rules.protected_last:
        return KEPT
    if rating == LOW_VALUE and not block.num_hits and rules.low_value_first:
        return LOW
    return HIT if block.num_hits and rules.hits_kept else FRESH


class HybridPolicy(EvictionPolicy):
    """Empty, low value, never hit, hit (capped), protected; the cycle guard puts
    never-hit releases first while requests cycle through more than the pool.

    >>> # free([a (LOW_VALUE), b (hit once)]), then free([c]): take(3) -> [a, c, b]
    """

    uses_hints = True
    rules: HybridRules = RULES
    evicted: Mapping[bytes, object]

    @classmethod
    def for_backend(cls, backend: str) -> type[EvictionPolicy]:
        """This class, the reference; or, under the C backend when `cls` changes no
        method (only `rules`), its C twin."""
        return c_twin(cls) if backend == "c" and runs_in_c(cls) else cls

    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        self._queues: list[OrderedDict[Block, None]] = [OrderedDict() for _ in range(5)]
        empty = self._queues[EMPTY]
        self._marks: dict[Block, int] = {}  # free block -> last clock LRU would hold it at
        for block in blocks:
            empty[block] = None
            block.queue_slot = EMPTY
            self._marks[block] = 0
        self._num_free = len(empty)
        self._size = max(self._num_free, 1)
        self._clock = 0  # blocks taken so far
        self._ghosts: OrderedDict[bytes, int] = OrderedDict()  # evicted hash -> its mark
        self.evicted = self._ghosts
        self._lru_share = self._cycle_share = 0.0

    def __len__(self) -> int:
        return self._num_free

    def __iter__(self) -> Iterator[Block]:
        for queue in self._queues:
            yield from queue

    def __contains__(self, block: Block) -> bool:
        return block.queue_slot >= 0 and block in self._queues[block.queue_slot]

    def is_cycling(self) -> bool:
        """Whether rule 4 (the cycle guard) is on now."""
        return self.rules.cycle_guard and self._cycle_share >= self._lru_share

    def add_free(self, blocks: Iterable[Block]) -> None:
        queues, marks, rules = self._queues, self._marks, self.rules
        mark = self._clock + self._num_free  # blocks ahead in one LRU queue, plus the clock
        cycling = self.is_cycling()
        fresh, front = queues[FRESH], []
        for block in blocks:
            marks[block] = mark
            mark += 1
            q = block.queue_slot = queue_of(block, rules)
            if q == FRESH:
                if cycling:
                    front.append(block)
                else:
                    fresh[block] = None
            elif q == EMPTY:  # reused first, as under `lru`
                queues[EMPTY][block] = None
                queues[EMPTY].move_to_end(block, last=False)
            else:
                queues[q][block] = None
        for block in reversed(front):  # the whole release first, its tail first
            fresh[block] = None
            fresh.move_to_end(block, last=False)
        self._num_free = mark - self._clock
        if len(queues[HIT]) > rules.hit_share * self._size:
            self._spill()

    def _spill(self) -> None:
        """Rule 3's cap: the hit queue's least recently used blocks join the back of
        the never-hit queue while it holds more than its share of the pool."""
        hit, fresh = self._queues[HIT], self._queues[FRESH]
        limit = self.rules.hit_share * self._size
        while len(hit) > limit:
            block = hit.popitem(last=False)[0]
            fresh[block] = None
            block.queue_slot = FRESH

    def remove(self, block: Block) -> None:
        self.remove_blocks((block,))

    def remove_blocks(self, blocks: Sequence[Block]) -> None:
        queues, marks, late = self._queues, self._marks, False
        for block in blocks:
            slot = block.queue_slot
            if block.ref_cnt and slot in (FRESH, HIT) and self._clock > marks[block]:
                late = True  # a hit on data LRU would have dropped
            del queues[slot][block]
            block.queue_slot = -1
            del marks[block]
        if late:
            self._vote(lru=False)
        self._num_free -= len(blocks)

    def take(self, num_blocks: int) -> list[Block]:
        out: list[Block] = []
        for queue in self._queues:
            pop = queue.popitem
            while queue and len(out) < num_blocks:
                out.append(pop(last=False)[0])
            if len(out) == num_blocks:
                break
        ghosts, marks = self._ghosts, self._marks
        for block in out:
            block.queue_slot = -1
            mark = marks.pop(block)
            if block.block_hash is not None:
                ghosts[block.block_hash] = mark
                ghosts.move_to_end(block.block_hash)
        while len(ghosts) > self.rules.ghost_pools * self._size:
            ghosts.popitem(last=False)
        self._num_free -= len(out)
        self._clock += len(out)
        return out

    def recomputed(self, block_hash: bytes) -> None:
        """Evicted data came back: before LRU would have dropped it, a vote for LRU
        order (after it, LRU would have lost it too: no vote)."""
        if self._clock <= self._ghosts.pop(block_hash):
            self._vote(lru=True)

    def _vote(self, lru: bool) -> None:
        weight = self.rules.vote_weight
        self._lru_share *= 1 - weight
        self._cycle_share *= 1 - weight
        if lru:
            self._lru_share += weight
        else:
            self._cycle_share += weight

    def uncache(self, block: Block) -> None:
        del self._queues[block.queue_slot][block]
        empty = self._queues[EMPTY]
        empty[block] = None
        empty.move_to_end(block, last=False)
        block.queue_slot = EMPTY

    def hint_changed(self, block: Block) -> None:
        """A new rating or hit count moves the block to its queue's back (not a
        release: its LRU mark stays)."""
        q = queue_of(block, self.rules)
        if q != block.queue_slot:
            del self._queues[block.queue_slot][block]
            block.queue_slot = q
            self._queues[q][block] = None
            self._spill()


def runs_in_c(cls: type[HybridPolicy]) -> bool:
    """Whether `cls` can run on the C twin: the extension is built and no class
    between it and HybridPolicy redefines a method (the C's would win)."""
    if fastpath.native is None or issubclass(cls, fastpath.native.HybridRulesCore):
        return False
    below = cls.__mro__[:cls.__mro__.index(HybridPolicy)]
    return not any(callable(getattr(HybridPolicy, name, None))
                   for klass in below for name in vars(klass) if name != "_c_twin")


def c_twin(cls: type[HybridPolicy]) -> type[HybridPolicy]:
    """`cls` on the C rules: a subclass of `HybridRulesCore` and `cls`, whose methods
    the C type's override (its `rules` are `cls.rules`); made once per class."""
    twin: type[HybridPolicy] | None = cls.__dict__.get("_c_twin")
    if twin is None:
        meta: Any = type(cls)  # ABCMeta
        twin = meta(cls.__name__, (fastpath.native.HybridRulesCore, cls),
                    {"__module__": cls.__module__, "__doc__": cls.__doc__})
        cls._c_twin = twin  # type: ignore[attr-defined]
    return twin
