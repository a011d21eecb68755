"""The reuse rules of the non-chain group types, over packed instance masks.

A lookup holds `vals`: for hash block j of the prompt, the packed masks of
every reuse class (`PrefixIndex.table`). A class's field at offset `off`
has bit s set when slot s caches the block. Each check answers, for a
candidate length L (in hash blocks, n = L / stride group blocks) and a mask
of slots, the slots whose group accepts L:

- sliding window: blocks n-window .. n-1 cached (all of 0 .. n-1 when
  n <= window) and the first min(n, sinks) blocks
  (`managers/sliding_window.py`);
- chunked local: blocks from the start of n's chunk to n-1 cached
  (`managers/chunked_local.py`);
- Mamba: the state ending at L cached (`managers/mamba.py`).

The scan itself drops slots missing the block that ends at L when a class
needs it (`needs_last_block`: Mamba, windows). The first few candidates
left are checked directly on `vals`; a class asked more
often (a layout without full attention, where every candidate length is
tried) builds its whole answer once, a window's in O(1) per length from
running ANDs inside segments of `window` blocks (van Herk / Gil-Werman).
"""

from __future__ import annotations

from bisect import bisect_right
from functools import reduce
from itertools import accumulate, compress, repeat
from operator import and_, rshift

from hybridkv.serving.router.layout import CHUNK, STATE, WINDOW, ReuseClass

# direct checks of a class may read this many times the prompt's blocks before
# the class builds its whole answer (which reads each a few times, in C loops)
DIRECT_BUDGET = 1.0


def make_check(rule: ReuseClass, off: int, width: int, vals: list[int],
               step: int) -> RuleCheck:
    """The check of one class for a lookup whose candidates are multiples of `step`."""
    kind = {STATE: StateCheck, WINDOW: WindowCheck, CHUNK: ChunkCheck}[rule.kind]
    return kind(rule, off, width, vals, step)


def needs_last_block(rule: ReuseClass) -> bool:
    """Whether every length L > 0 the class accepts has the block ending at L cached."""
    return rule.kind == STATE or (rule.kind == WINDOW and rule.window > 0)


def first_zero_field(chain: list[int], off: int, width: int, restrict: int = -1) -> int:
    """Largest n <= len(chain) with field(chain[n - 1]) & restrict != 0 (0 if
    none); the fields shrink along `chain` (running ANDs), so this bisects."""
    full = ((1 << width) - 1) & restrict
    if not chain or (chain[-1] >> off) & full:
        return len(chain)
    lo, hi = 0, len(chain) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if (chain[mid - 1] >> off) & full:
            lo = mid
        else:
            hi = mid - 1
    return lo


class RuleCheck:
    """`check(length, mask)`: the slots of `mask` whose group accepts `length`.

    Direct checks first; once they have read DIRECT_BUDGET times the
    prompt's blocks, the whole answer at once.
    """

    def __init__(self, rule: ReuseClass, off: int, width: int, vals: list[int],
                 step: int) -> None:
        self.rule, self.off, self.width, self.vals = rule, off, width, vals
        self.stride, self.step = rule.stride, step  # candidate lengths: multiples of step
        self.budget = DIRECT_BUDGET * len(vals) / rule.stride
        self.accepts: list[int] | None = None
        # group block counts (at candidates) some slot of `accepting_for` accepts
        self.accepting: list[int] = []
        self.accepting_for = 0

    def __call__(self, length: int, mask: int) -> int:
        n = length // self.stride
        if self.accepts is None:
            self.budget -= self.span(n)
            if self.budget >= 0:
                return self.direct(n, mask)
            full = (1 << self.width) - 1
            fields = map(rshift, self.vals[self.stride - 1::self.stride], repeat(self.off))
            self.accepts = self.build(list(map(and_, fields, repeat(full))), full)
        return mask & self.accepts[n]

    def skip(self, length: int, remaining: int) -> int:
        """The largest candidate <= `length` some slot of `remaining` may pass
        (once the whole answer is built; before, `length` itself)."""
        if self.accepts is None:
            return length
        if remaining != self.accepting_for:
            every = self.step // self.stride
            candidates = self.accepts[::every]
            self.accepting = list(compress(range(0, len(self.accepts), every),
                                           map(and_, candidates, repeat(remaining))))
            self.accepting_for = remaining
        i = bisect_right(self.accepting, length // self.stride)
        return self.accepting[i - 1] * self.stride if i else 0

    def and_blocks(self, start: int, end: int) -> int:
        """Field of the AND over group blocks start .. end-1 (all ones if none)."""
        s = self.stride
        return reduce(and_, self.vals[(start + 1) * s - 1:end * s:s], -1) >> self.off

    def direct(self, n: int, mask: int) -> int:
        raise NotImplementedError

    def span(self, n: int) -> int:
        """Blocks a direct check of n blocks reads."""
        return 1

    def build(self, held: list[int], full: int) -> list[int]:
        raise NotImplementedError


class StateCheck(RuleCheck):
    def __call__(self, length: int, mask: int) -> int:
        return mask & (self.vals[length - 1] >> self.off)


class WindowCheck(RuleCheck):
    def direct(self, n: int, mask: int) -> int:
        rule, s = self.rule, self.stride
        start = max(0, n - rule.window)
        if start < n:
            if not mask & (self.vals[(start + 1) * s - 1] >> self.off):
                return 0  # the window's first block is missing (a cheap common refusal)
            mask &= self.and_blocks(start, n)
        if mask and rule.sinks and n > rule.window:
            mask &= self.and_blocks(0, min(n, rule.sinks))
        return mask

    def span(self, n: int) -> int:
        return min(n, self.rule.window) + (self.rule.sinks if n > self.rule.window else 0)

    def build(self, held: list[int], full: int) -> list[int]:
        return window_accepts(held, self.rule.window, self.rule.sinks, full)


class ChunkCheck(RuleCheck):
    def span(self, n: int) -> int:
        return n % self.rule.chunk

    def __call__(self, length: int, mask: int) -> int:
        if length // self.stride % self.rule.chunk == 0:
            return mask  # a chunk boundary: nothing needed
        return super().__call__(length, mask)

    def direct(self, n: int, mask: int) -> int:
        return mask & self.and_blocks(n // self.rule.chunk * self.rule.chunk, n)

    def build(self, held: list[int], full: int) -> list[int]:
        return chunk_accepts(held, self.rule.chunk, full)


def window_accepts(held: list[int], window: int, sinks: int, live: int) -> list[int]:
    """acc[n]: the slots accepting n blocks, for held[j] the slots caching block j.

    >>> window_accepts([0b11, 0b01, 0b11], window=2, sinks=0, live=0b11)
    [3, 3, 1, 1]
    """
    n_max = len(held)
    if window == 0:
        acc = [live] * (n_max + 1)
    else:
        heads: list[int] = []  # running ANDs inside segments of `window` blocks
        tails: list[int] = []
        for a in range(0, n_max, window):
            segment = held[a:a + window]
            heads += accumulate(segment, and_)
            tails += reversed(list(accumulate(reversed(segment), and_)))
        # n <= window: blocks 0..n-1 (the first segment's head); else the tail of
        # n-window's segment and the head of n-1's
        acc = [live, *heads[:window], *map(and_, tails[1:n_max - window + 1], heads[window:])]
    if sinks:
        sink_run = list(accumulate(held[:sinks], and_, initial=live))
        for n in range(1, n_max + 1):
            acc[n] &= sink_run[min(n, sinks)]
    return acc


def chunk_accepts(held: list[int], chunk: int, live: int) -> list[int]:
    """acc[n]: the slots accepting n blocks for chunks of `chunk` blocks.

    >>> chunk_accepts([0b01, 0b11, 0b10], chunk=2, live=0b11)
    [3, 1, 3, 2]
    """
    acc = [live]
    for a in range(0, len(held), chunk):
        acc += accumulate(held[a:a + chunk], and_)
    for n in range(chunk, len(held) + 1, chunk):
        acc[n] = live
    return acc
