"""A clairvoyant yardstick for hit rates under memory pressure.

`PrefixIndex` names every full block of a trace by its place in the prefix
tree (equal names, equal prefixes) and finds each request's *target*: the
longest prefix earlier requests produced, which is what an infinite pool
would reuse (`reuse_ceiling`). `reusable_blocks` is the working set a pool
competes for.

`ClairvoyantCache` is a `hybridkv.tools.replay.CacheAdapter` that knows
the whole trace. Its reuse rules are the library's (a hit needs every
full-attention block before it, the window before it for a sliding window,
the state at it for Mamba), and its pool has the same number of blocks,
but:

- it keeps only what a future hit needs: a window block or a Mamba state is
  kept (held by its request until the request ends) when some later request
  stops at its end, at its target or, as a fallback, at a junction of the
  prefix tree below the target or every `checkpoint_tokens`;
  others are dropped as soon as the request no longer needs them, and Mamba
  states nobody needs are never written;
- it evicts like Belady: the idle block whose next use is furthest ahead
  ("now" being the newest request admitted), the deepest block of a prefix
  first on ties;
- it admits a request only when its whole sequence fits.

Replayed by the same driver as a real manager, it estimates what a manager
that knew the future could reach on that pool. An estimate, not a proven
optimum: Belady is optimal for single blocks, not for prefix chains, so a
real policy can edge past it on some traces.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence

from hybridkv.tools.replay import TraceLike

_NEVER = 1 << 60
_ANON = -1  # a block holding data no lookup can find (a partial block)
FULL, WINDOW, STATE = 0, 1, 2  # item = node * 3 + kind


class PrefixIndex:
    """Block-level prefix tree of a trace.

    `nodes[i]`: the node of every full block of request i (prompt and output);
    `target[i]`: its infinite-pool hit in blocks (capped below the prompt end,
    like a real lookup); `junctions[i]`: block counts below the target where
    the tree branches; `depth[n]`: blocks from the root to node n.
    """

    def __init__(self, requests: Sequence[TraceLike], block_size: int) -> None:
        self.block_size = bs = block_size
        tree: dict[tuple[int, tuple[int, ...]], int] = {}
        self.nodes: list[list[int]] = []
        self.target: list[int] = []
        self.prompt_tokens: list[int] = []
        self.depth: list[int] = []
        for r in requests:
            seq = tuple(r.prompt) + tuple(r.output)
            known_before, parent, run, ids = len(tree), -1, 0, []
            for p in range(len(seq) // bs):
                key = (parent, seq[p * bs:(p + 1) * bs])
                node = tree.get(key)
                if node is None:
                    node = tree[key] = len(tree)
                    self.depth.append(p + 1)
                if run == p and node < known_before:
                    run += 1
                ids.append(node)
                parent = node
            self.nodes.append(ids)
            self.target.append(min(run, (len(r.prompt) - 1) // bs))
            self.prompt_tokens.append(len(r.prompt))
        children = [0] * len(tree)
        for parent, _ in tree:
            if parent >= 0:
                children[parent] += 1
        self.junctions = [[p + 1 for p in range(t - 1) if children[ids[p]] > 1]
                          for ids, t in zip(self.nodes, self.target)]


def reuse_ceiling(index: PrefixIndex) -> float:
    """Hit rate with an infinite pool."""
    return sum(index.target) * index.block_size / max(1, sum(index.prompt_tokens))


def reusable_blocks(index: PrefixIndex) -> int:
    """Distinct full-attention blocks some later request's infinite-pool hit covers."""
    used: set[int] = set()
    for ids, t in zip(index.nodes, index.target):
        used.update(ids[:t])
    return len(used)


class _Seq:
    __slots__ = ("i", "nodes", "known", "computed", "full", "window", "kept", "live", "hit",
                 "admitted")

    def __init__(self, i: int, nodes: list[int], known: int) -> None:
        self.i = i
        self.nodes = nodes
        self.known = known
        self.computed = 0
        self.full: list[int] = []  # item or _ANON per position
        self.window: list[int | None] = []  # item, _ANON or None (left the window)
        self.kept: list[int] = []  # window blocks and states held for later hits
        self.live = False  # Mamba: holds its running state's block
        self.hit: int | None = None  # blocks found by the last lookup
        self.admitted = False


class ClairvoyantCache:
    """A clairvoyant cache over `requests` (see the module docstring).

    `kind`: "full", "swa" (full + sliding window `window`) or "mamba"
    (full + Mamba); `num_blocks` counts the null block, like a real pool.
    """

    def __init__(self, requests: Sequence[TraceLike], kind: str, num_blocks: int,
                 block_size: int, window: int = 1024, index: PrefixIndex | None = None,
                 checkpoint_tokens: int = 0) -> None:
        if kind not in ("full", "swa", "mamba"):
            raise ValueError(f"kind must be full, swa or mamba, got {kind!r}")
        self.kind = kind
        self.bs = block_size
        self.window_tokens = window
        self.w = -(-(window - 1) // block_size)  # blocks a window hit needs
        self.index = index or PrefixIndex(requests, block_size)
        self.position = {r.request_id: i for i, r in enumerate(requests)}
        self.free_blocks = num_blocks - 1
        self.holders: dict[int, int] = {}  # item -> holders (0: idle, evictable)
        self.next_use: dict[int, int] = {}  # idle item -> next request needing it
        self.heap: list[tuple[int, int, int]] = []  # (-next use, -depth, item), lazy
        self.now = -1
        self.evictions = 0
        self.wants, self.uses = self._plan(checkpoint_tokens // block_size)

    def _plan(self, every: int) -> tuple[list[list[int]], dict[int, list[int]]]:
        """Per request, the items its hit (target or a fallback stop) needs; per item,
        the requests needing it in order."""
        ix, kind, w = self.index, self.kind, self.w
        wants, uses = [], {}
        for i, (ids, t) in enumerate(zip(ix.nodes, ix.target)):
            items = {n * 3 for n in ids[:t]}
            if t and kind != "full":
                stops = set(ix.junctions[i]) | {t}
                if every:
                    stops.update(range(every, t, every))
                for d in stops:
                    if kind == "swa":
                        items.update(n * 3 + WINDOW for n in ids[max(0, d - w):d])
                    else:
                        items.add(ids[d - 1] * 3 + STATE)
            wants.append(list(items))
            for item in items:
                uses.setdefault(item, []).append(i)
        return wants, uses

    # ---- blocks and items ------------------------------------------------------

    def _next(self, item: int) -> int:
        u = self.uses.get(item)
        if not u:
            return _NEVER
        k = bisect_right(u, self.now)
        return u[k] if k < len(u) else _NEVER

    def _idle(self, item: int, nxt: int) -> None:
        self.next_use[item] = nxt
        heapq.heappush(self.heap, (-nxt, -self.index.depth[item // 3], item))

    def _hold(self, item: int) -> None:
        n = self.holders[item]
        if not n:
            del self.next_use[item]
        self.holders[item] = n + 1

    def _drop(self, item: int | None) -> None:
        if item is None:
            return
        if item == _ANON:
            self.free_blocks += 1
            return
        n = self.holders[item] - 1
        self.holders[item] = n
        if n:
            return
        nxt = self._next(item)
        if nxt == _NEVER:  # nobody will look it up: the block is free at once
            del self.holders[item]
            self.free_blocks += 1
        else:
            self._idle(item, nxt)

    def _take(self) -> None:
        """Use one block; when none is free evict the idle item needed furthest ahead."""
        if not self.free_blocks:
            while True:
                neg, _, item = heapq.heappop(self.heap)
                if self.next_use.get(item) == -neg:
                    break  # else an outdated entry
            del self.next_use[item]
            del self.holders[item]
            self.evictions += 1
            self.free_blocks += 1
        self.free_blocks -= 1

    def _store(self, item: int) -> int:
        """A block for freshly computed data: share a present copy, else a new block."""
        if item in self.holders:
            self._hold(item)
        else:
            self._take()
            self.holders[item] = 1
        return item

    # ---- allocation -------------------------------------------------------------

    def _hit_items(self, s: _Seq, hit: int) -> list[int]:
        items = [n * 3 for n in s.nodes[:hit]]
        if self.kind == "swa":
            items += [n * 3 + WINDOW for n in s.nodes[max(0, hit - self.w):hit]]
        elif self.kind == "mamba" and hit:
            items.append(s.nodes[hit - 1] * 3 + STATE)
        return items

    def _new_states(self, s: _Seq, c: int, t: int) -> list[int]:
        """Mamba states at boundaries in (c, t] a later hit needs and no block holds."""
        out = []
        for q in range(c // self.bs + 1, t // self.bs + 1):
            item = s.nodes[q - 1] * 3 + STATE
            if item not in self.holders and item in self.uses and self._next(item) < _NEVER:
                out.append(item)
        return out

    def _need(self, s: _Seq, c: int, t: int, hit: int, whole: bool = False,
              states: list[int] | None = None) -> int:
        positions = -(-t // self.bs)
        need = positions - max(len(s.full), hit)
        if self.kind == "swa":
            side = positions - max(len(s.window), hit)
            need += min(side, self.w + 1) if whole else side
        elif self.kind == "mamba":
            new = self._new_states(s, c, t) if states is None else states
            need += (not s.live) + len(new)
        return need

    def _fits(self, s: _Seq, c: int, t: int, hit: int, hit_items: list[int],
              states: list[int]) -> bool:
        avail = self.free_blocks + len(self.next_use)
        avail -= sum(1 for it in set(hit_items) if it in self.next_use)
        if self.kind == "swa":
            lo = max(0, (c - self.window_tokens + 1) // self.bs)
            for p in range(min(lo, len(s.window))):
                it = s.window[p]
                if it == _ANON or (it is not None and self.holders[it] == 1
                                   and self._next(it) == _NEVER):
                    avail += 1
        if self._need(s, c, t, hit, states=states) > avail:
            return False
        # a request is admitted only when its whole sequence fits
        return s.admitted or self._need(s, c, s.known, hit, whole=True) <= avail

    def _adopt(self, s: _Seq, hit: int, hit_items: list[int]) -> None:
        if s.i > self.now:  # the first admission: its wanted items' next use moves on
            self.now = s.i
            for item in self.wants[s.i]:
                if item in self.next_use:
                    self._idle(item, self._next(item))
        for item in hit_items:
            self._hold(item)
        s.full = hit_items[:hit]
        if self.kind == "swa":
            s.window = [None] * max(0, hit - self.w) + hit_items[hit:]  # type: ignore
        elif self.kind == "mamba" and hit:
            s.kept.append(hit_items[-1])

    def _slide(self, s: _Seq, c: int) -> None:
        """Window blocks before the window of `c`: kept when a later hit needs them."""
        lo = max(0, (c - self.window_tokens + 1) // self.bs)
        for p in range(min(lo, len(s.window))):
            item = s.window[p]
            if item is None:
                continue
            s.window[p] = None
            if item != _ANON and self._next(item) < _NEVER:
                s.kept.append(item)
            else:
                self._drop(item)

    def _grow(self, blocks: list, s: _Seq, c: int, t: int, kind: int) -> None:
        bs, done = self.bs, t // self.bs
        for p in range(c // bs, min(done, len(blocks))):  # partial blocks now full
            if blocks[p] == _ANON:
                item = s.nodes[p] * 3 + kind
                if item in self.holders:
                    self.free_blocks += 1
                    self._hold(item)
                else:
                    self.holders[item] = 1
                blocks[p] = item
        for p in range(len(blocks), -(-t // bs)):
            if p < done:
                blocks.append(self._store(s.nodes[p] * 3 + kind))
            else:
                self._take()
                blocks.append(_ANON)

    def _allocate(self, s: _Seq, n: int) -> bool:
        hit = s.hit or 0
        hit_items = self._hit_items(s, hit) if s.hit is not None else []
        c = s.computed + hit * self.bs
        t = c + n
        # Mamba states to write, worked out once: a take below may evict a state
        # counted present here, which must not be written (and counted) twice
        states = self._new_states(s, c, t) if self.kind == "mamba" else []
        if not self._fits(s, c, t, hit, hit_items, states):
            return False
        if s.hit is not None:
            self._adopt(s, hit, hit_items)
            s.hit = None
            s.admitted = True
        if self.kind == "swa":
            self._slide(s, c)
        self._grow(s.full, s, c, t, FULL)
        if self.kind == "swa":
            self._grow(s.window, s, c, t, WINDOW)
        elif self.kind == "mamba":
            if not s.live:
                self._take()
                s.live = True
            s.kept += [self._store(item) for item in states]
        s.computed = t
        return True

    # ---- CacheAdapter -------------------------------------------------------------

    def start(self, req: TraceLike) -> _Seq:
        i = self.position[req.request_id]
        return _Seq(i, self.index.nodes[i], len(req.prompt))

    def lookup(self, s: _Seq) -> int:
        holders, nodes = self.holders, s.nodes
        limit = min((s.known - 1) // self.bs, len(nodes))
        hit = 0
        while hit < limit and nodes[hit] * 3 in holders:
            hit += 1
        if self.kind == "swa":
            while hit > 0:  # a missing block in the window: try below it
                lo = max(0, hit - self.w)
                miss = next((q for q in range(hit - 1, lo - 1, -1)
                             if nodes[q] * 3 + WINDOW not in holders), None)
                if miss is None:
                    break
                hit = miss
        elif self.kind == "mamba":
            while hit > 0 and nodes[hit - 1] * 3 + STATE not in holders:
                hit -= 1
        s.hit = hit
        return hit * self.bs

    def allocate(self, s: _Seq, num_new_tokens: int) -> bool:
        return self._allocate(s, num_new_tokens)

    def append(self, s: _Seq, token: int) -> None:
        s.known += 1

    def free(self, s: _Seq) -> None:
        for item in reversed(s.full):
            self._drop(item)
        for item in reversed(s.window):
            self._drop(item)
        for item in reversed(s.kept):
            self._drop(item)
        if s.live:
            self.free_blocks += 1
        s.full, s.window, s.kept, s.live, s.hit = [], [], [], False, None

    def preempt(self, s: _Seq) -> None:
        self.free(s)
        s.computed = 0
        s.admitted = False

    @property
    def num_free_blocks(self) -> int:
        return self.free_blocks + len(self.next_use)
