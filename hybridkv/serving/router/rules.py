"""The reuse rules of the windowed group types over instance masks.

`held[j]` is the mask of instances caching group block j. Each function
returns `acc` with `acc[n]` the mask of instances whose group can reuse the
first n group blocks (`acc[0]` is every live instance), the rules of
`managers/sliding_window.py` and `managers/chunked_local.py`:

- sliding window: blocks n-window .. n-1 cached (all of 0 .. n-1 when
  n <= window) and the first min(n, sinks) blocks;
- chunked local: blocks from the start of n's chunk to n-1 cached.

A window's AND is taken in O(1) per n from running ANDs inside segments of
`window` blocks (van Herk / Gil-Werman): a window of exactly `window`
blocks spans the tail of one segment and the head of the next.
"""

from __future__ import annotations


def window_accepts(held: list[int], window: int, sinks: int, live: int) -> list[int]:
    """Masks accepting n blocks for a sliding window of `window` blocks, `sinks` sink blocks.

    >>> window_accepts([0b11, 0b01, 0b11], window=2, sinks=0, live=0b11)
    [3, 3, 1, 1]
    """
    n_max = len(held)
    acc = [live] * (n_max + 1)
    if window == 0:
        head = live
        for n in range(1, min(sinks, n_max) + 1):
            head &= held[n - 1]
            acc[n] = head
        for n in range(min(sinks, n_max) + 1, n_max + 1):
            acc[n] = head
        return acc
    head_run = _segment_heads(held, window)
    tail_run = _segment_tails(held, window)
    sink = live
    for n in range(1, n_max + 1):
        if n <= sinks:
            sink &= held[n - 1]
        if n <= window:
            acc[n] = head_run[n - 1] & sink
        else:
            acc[n] = tail_run[n - window] & head_run[n - 1] & sink
    return acc


def chunk_accepts(held: list[int], chunk: int, live: int) -> list[int]:
    """Masks accepting n blocks for chunks of `chunk` blocks.

    >>> chunk_accepts([0b01, 0b11, 0b10], chunk=2, live=0b11)
    [3, 1, 3, 2]
    """
    acc = [live] * (len(held) + 1)
    run = live
    for j, mask in enumerate(held):
        run = mask if j % chunk == 0 else run & mask
        acc[j + 1] = run
    for n in range(0, len(held) + 1, chunk):
        acc[n] = live
    return acc


def _segment_heads(held: list[int], size: int) -> list[int]:
    """out[x]: AND of held[x0 .. x], x0 the start of x's segment of `size`."""
    out = [0] * len(held)
    run = 0
    for x, mask in enumerate(held):
        run = mask if x % size == 0 else run & mask
        out[x] = run
    return out


def _segment_tails(held: list[int], size: int) -> list[int]:
    """out[x]: AND of held[x .. x1], x1 the end of x's segment of `size` (or the list)."""
    n = len(held)
    out = [0] * n
    run = 0
    for x in range(n - 1, -1, -1):
        mask = held[x]
        run = mask if x % size == size - 1 or x == n - 1 else run & mask
        out[x] = run
    return out
