"""Where a block would stand in one LRU free queue, without keeping that queue.

`hybrid` asks, for a block it is about to lose or has just hit, whether plain LRU
(`lru`: empty blocks at the front, then released or hit blocks in order) would
still hold it. A block released when f blocks were free has f blocks ahead of it
in that queue. Since then:

- every block taken came from the front: one fewer ahead;
- every empty block released went to the front: one more ahead;
- every hit on a block released before it took one from ahead of it (hits on
  blocks released after it change nothing).

So its position is f - taken + empties - (hits on earlier releases): 0 at the
front, and negative once LRU would have taken it. The last term counts hits by
the release order of the block hit, over a ring of `capacity` release numbers:
one bit per release (hit or not) and a Fenwick tree over the hit counts of
words of 64 bits (a popcount within a word). Hits on releases older than the ring count as
ancient, ahead of every release in it; a block released before the ring's start
counts every ancient hit as ahead of it (the only approximation: such a block sat
free for longer than `capacity` releases).

A release is marked by two integers, its number and a base from which the
position follows (`position`): the policy keeps them on the block while it is
free and with its hash once it is evicted. The C extension's `_fp_lrupos.c` is
the same structure, number for number.
"""

from __future__ import annotations


class LruPositions:
    """The LRU queue positions of released blocks (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1 or capacity & (capacity - 1):
            raise ValueError(f"LruPositions: capacity must be a power of two, got {capacity}")
        self._cap = capacity
        words = (capacity + 63) // 64
        self._hit = [0] * words  # bit s of word s // 64: a hit on the release in ring slot s
        self._tree = [0] * (words + 1)  # Fenwick tree over the words' hit counts (1-based)
        self._live = 0  # hits recorded in the ring
        self._next = 0  # the next release number
        self._records = 0  # hits recorded, ancient ones included
        self._ancient = 0  # hits recorded on releases now older than the ring
        self._drift = 0  # blocks taken minus empty blocks released

    def release(self, free: int, empty: bool) -> tuple[int, int]:
        """Marks a block released with `free` blocks ahead of it: (number, base)."""
        number = self._next
        self._next += 1
        slot = number & (self._cap - 1)
        word, bit = slot >> 6, 1 << (slot & 63)
        if self._hit[word] & bit:  # that slot's previous release leaves the ring
            self._hit[word] &= ~bit
            self._add(word, -1)
            self._ancient += 1
        mark = (number, free + self._drift + self._records)
        if empty:
            self._drift -= 1
        return mark

    def taken(self, count: int) -> None:
        """`count` blocks were taken from the front."""
        self._drift += count

    def hit(self, number: int) -> None:
        """The block released as `number` left the queue (a hit): blocks released
        after it have one fewer ahead."""
        if number < self._next - self._cap:
            self._records += 1
            self._ancient += 1
            return
        slot = number & (self._cap - 1)
        word, bit = slot >> 6, 1 << (slot & 63)
        if self._hit[word] & bit:  # recorded already: a release leaves the queue once
            return
        self._records += 1
        self._hit[word] |= bit
        self._add(word, 1)

    def to_front(self, number: int) -> None:
        """The block released as `number` lost its data and moved to the front."""
        self.hit(number)
        self._drift -= 1

    def position(self, mark: tuple[int, int]) -> int:
        """Blocks ahead of the release marked `mark` (< 0: LRU would have taken it)."""
        number, base = mark
        return base - self._drift - self._hits_before(number)

    def _hits_before(self, number: int) -> int:
        start = self._next - self._cap  # the oldest release in the ring
        if number <= start:
            return self._ancient
        mask = self._cap - 1
        lo, hi = (0 if start < 0 else start & mask), number & mask
        inside = self._prefix(hi) - self._prefix(lo) if lo <= hi else \
            self._live - self._prefix(lo) + self._prefix(hi)
        return self._ancient + inside

    def _add(self, word: int, delta: int) -> None:
        tree, i = self._tree, word + 1
        while i < len(tree):
            tree[i] += delta
            i += i & -i
        self._live += delta

    def _prefix(self, slot: int) -> int:
        """Hits recorded in ring slots [0, slot)."""
        tree, i, total = self._tree, slot >> 6, 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        if slot & 63:
            total += (self._hit[slot >> 6] & ((1 << (slot & 63)) - 1)).bit_count()
        return total
