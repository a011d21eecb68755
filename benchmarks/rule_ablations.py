"""`hybrid` with one rule changed, for measuring what each rule is worth on the grid.

A plugin for `bench_policy_grid.py --plugin benchmarks/rule_ablations.py`: it
registers, on the public `EvictionPolicy` interface only, the default's four
queues (docs/eviction.md, "`hybrid`: four rules") with one rule removed, and
one rule tried as a fifth:

- `no-empty-first`: a block with no data queues in LRU order like the others;
- `no-low-first`: a never-hit low-value block queues in LRU order;
- `no-protect`: a protected block queues in LRU order;
- `hit-last`: a fifth rule, never-hit data before data a hit used (each in
  LRU order), as hit-ranking orders do;
- `junction-last`: a fifth rule, a block rated `JUNCTION` (a window or state
  where prompts were seen to branch) after the other ordered blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.eviction import (
    JUNCTION,
    LOW_VALUE,
    PROTECTED,
    EvictionPolicy,
    register_eviction_policy,
)

EMPTY, LOW, FRESH, HIT, BRANCH, KEPT = range(6)


class RuleVariant(EvictionPolicy):
    """The four rules' queues (plus a hit queue), each rule switchable."""

    uses_hints = True
    empty_first = low_first = protect = True
    hit_last = junction_last = False

    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        self._queues: list[OrderedDict[Block, None]] = [OrderedDict() for _ in range(6)]
        self._where: dict[Block, int] = {}
        for block in blocks:
            self._queues[EMPTY][block] = None
            self._where[block] = EMPTY

    def queue_of(self, block: Block) -> int:
        if block.block_hash is None and self.empty_first:
            return EMPTY
        if block.value_hint == PROTECTED and self.protect:
            return KEPT
        if block.value_hint == LOW_VALUE and not block.num_hits and self.low_first:
            return LOW
        if block.value_hint == JUNCTION and self.junction_last:
            return BRANCH
        return HIT if self.hit_last and block.num_hits else FRESH

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[Block]:
        for queue in self._queues:
            yield from queue

    def __contains__(self, block: Block) -> bool:
        return block in self._where

    def add_free(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            q = self.queue_of(block)
            self._where[block] = q
            self._queues[q][block] = None
            if q == EMPTY:
                self._queues[q].move_to_end(block, last=False)

    def remove(self, block: Block) -> None:
        del self._queues[self._where.pop(block)][block]

    def take(self, num_blocks: int) -> list[Block]:
        out: list[Block] = []
        for queue in self._queues:
            while queue and len(out) < num_blocks:
                block = queue.popitem(last=False)[0]
                del self._where[block]
                out.append(block)
        return out

    def uncache(self, block: Block) -> None:
        self.remove(block)
        self._where[block] = EMPTY
        self._queues[EMPTY][block] = None
        self._queues[EMPTY].move_to_end(block, last=False)

    def hint_changed(self, block: Block) -> None:
        q = self.queue_of(block)
        if q != self._where[block]:
            self.remove(block)
            self._where[block] = q
            self._queues[q][block] = None


class NoEmptyFirst(RuleVariant):
    empty_first = False


class NoLowFirst(RuleVariant):
    low_first = False


class NoProtect(RuleVariant):
    protect = False


class HitLast(RuleVariant):
    hit_last = True


class JunctionLast(RuleVariant):
    junction_last = True


for _name, _cls in (("four-rules", RuleVariant), ("no-empty-first", NoEmptyFirst),
                    ("no-low-first", NoLowFirst), ("no-protect", NoProtect),
                    ("hit-last", HitLast), ("junction-last", JunctionLast)):
    register_eviction_policy(_name, _cls)
