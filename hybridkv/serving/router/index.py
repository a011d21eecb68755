"""Which prefixes every instance can reuse, kept from the instances' block events.

One `PrefixIndex` serves all instances of one cache layout. Each instance
owns a bit; per reuse class (see `layout.ReuseClass`) a table maps a block
hash to the mask of instances caching it in every group of the class. A
lookup hashes nothing: it takes the prompt's block hashes (at the layout's
hash block size, salted as the backends salt them) and answers for all
instances at once with integer masks, so its cost grows with the prompt's
matched length, not with the number of instances.

The answer is the coordinator's: for each instance, the largest length
L <= max_tokens, a multiple of the lcm of the group block sizes, that every
group's reuse rule accepts given the blocks that instance caches
(`HybridCoordinator.find_longest_cache_hit`; the tests hold the two equal on
random cache states of the real manager).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from hybridkv.kv_cache.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from hybridkv.serving.router.layout import CHAIN, CHUNK, STATE, WINDOW, CacheLayout
from hybridkv.serving.router.rules import chunk_accepts, window_accepts


class Reuse(NamedTuple):
    """Reusable tokens per instance: `levels` are (tokens, mask of instances),
    longest first; instances in no level reuse nothing."""

    levels: list[tuple[int, int]]

    def tokens(self, bit: int) -> int:
        flag = 1 << bit
        for tokens, mask in self.levels:
            if mask & flag:
                return tokens
        return 0

    def per_slot(self, num_slots: int) -> list[int]:
        """Tokens for slots 0 .. num_slots-1."""
        out = [0] * num_slots
        for tokens, mask in self.levels:
            while mask:
                low = mask & -mask
                out[low.bit_length() - 1] = tokens
                mask ^= low
        return out


class PrefixIndex:
    """Cached hashes of every instance of one layout, and reuse lookups over them."""

    def __init__(self, layout: CacheLayout) -> None:
        self.layout = layout
        self.classes, self.group_class = layout.reuse_classes()
        self.class_size = [self.group_class.count(c) for c in range(len(self.classes))]
        self.tables: list[dict[bytes, int]] = [{} for _ in self.classes]
        self.slots: list[str | None] = []  # bit -> instance id (None: free slot)
        self.bit_of: dict[str, int] = {}
        # per instance, per class: hash -> how many groups of the class cache it
        self._held: dict[str, list[dict[bytes, int]]] = {}
        self.live_mask = 0
        self.hash_block_size = layout.hash_block_size
        self._step = layout.alignment // self.hash_block_size
        self._chain_ids = [c for c, r in enumerate(self.classes) if r.kind == CHAIN]
        self._other_ids = [c for c, r in enumerate(self.classes) if r.kind != CHAIN]
        # the chain a router unaware of the other groups would match (`chain_lookup`)
        self._prefix_class = self._chain_ids[0] if self._chain_ids else self.group_class[0]
        self.num_unknown_removals = 0

    # ---- instances -------------------------------------------------------------

    def add_instance(self, instance_id: str) -> int:
        """Give `instance_id` a bit (the lowest free one); returns it. Idempotent."""
        if instance_id in self.bit_of:
            return self.bit_of[instance_id]
        bit = self.slots.index(None) if None in self.slots else len(self.slots)
        if bit == len(self.slots):
            self.slots.append(None)
        self.slots[bit] = instance_id
        self.bit_of[instance_id] = bit
        self._held[instance_id] = [{} for _ in self.classes]
        self.live_mask |= 1 << bit
        return bit

    def remove_instance(self, instance_id: str) -> None:
        """Forget the instance and everything it cached; its bit becomes free."""
        self.clear(instance_id)
        bit = self.bit_of.pop(self._check(instance_id))
        del self._held[instance_id]
        self.slots[bit] = None
        self.live_mask &= ~(1 << bit)

    def clear(self, instance_id: str) -> None:
        """The instance caches nothing (AllBlocksCleared)."""
        held = self._held[self._check(instance_id)]
        keep = ~(1 << self.bit_of[instance_id])
        for c, counts in enumerate(held):
            table, full = self.tables[c], self.class_size[c]
            for block_hash, count in counts.items():
                if count == full:
                    mask = table[block_hash] & keep
                    if mask:
                        table[block_hash] = mask
                    else:
                        del table[block_hash]
            counts.clear()

    def num_cached_blocks(self, instance_id: str) -> int:
        """Group blocks the instance caches, as its events tell."""
        return sum(sum(counts.values()) for counts in self._held[self._check(instance_id)])

    def _check(self, instance_id: str) -> str:
        if instance_id not in self._held:
            raise KeyError(f"unknown instance {instance_id!r}")
        return instance_id

    # ---- events ----------------------------------------------------------------

    def apply_events(self, instance_id: str, events: Iterable[BlockEvent]) -> None:
        """Apply one instance's events in order.

        Raises ValueError for a group id outside the layout (an instance with
        another layout); events before it stay applied. A removal of a hash
        the index never saw stored is counted and ignored (a stream read
        from the middle).
        """
        held = self._held[self._check(instance_id)]
        bit = 1 << self.bit_of[instance_id]
        group_class, sizes, tables = self.group_class, self.class_size, self.tables
        for event in events:
            kind = type(event)
            if kind is AllBlocksCleared:
                self.clear(instance_id)
                continue
            group_id = event.group_id  # type: ignore[union-attr]
            if not 0 <= group_id < len(group_class):
                raise ValueError(f"block event for group {group_id} of instance "
                                 f"{instance_id!r}: the layout has {len(group_class)} groups")
            c, block_hash = group_class[group_id], event.block_hash  # type: ignore[union-attr]
            counts = held[c]
            count = counts.get(block_hash, 0)
            if kind is BlockStored:
                counts[block_hash] = count + 1
                if count + 1 == sizes[c]:
                    tables[c][block_hash] = tables[c].get(block_hash, 0) | bit
            elif kind is BlockRemoved:
                if not count:
                    self.num_unknown_removals += 1
                    continue
                if count == sizes[c]:
                    mask = tables[c][block_hash] & ~bit
                    if mask:
                        tables[c][block_hash] = mask
                    else:
                        del tables[c][block_hash]
                if count == 1:
                    del counts[block_hash]
                else:
                    counts[block_hash] = count - 1

    # ---- lookups ---------------------------------------------------------------

    def lookup(self, block_hashes: Sequence[bytes], max_tokens: int) -> Reuse:
        """Tokens every instance can reuse for a prompt with these block hashes.

        `max_tokens` is the prompt length minus one (a hit leaves at least
        one token to compute). Example (B=16, full + window of 2 blocks):
        instance 0 caches full blocks 0-3 and window blocks 2-3, instance 1
        full 0-3 and window 0-1; a 65-token prompt -> levels
        [(64, 0b01), (32, 0b10)].
        """
        step = self._step
        top = min(max_tokens // self.layout.alignment * step, len(block_hashes) // step * step)
        live = self.live_mask
        if top <= 0 or not live:
            return Reuse([])
        accepts: list[tuple[int, list[int]]] = []  # (stride, mask accepting n group blocks)
        remaining = live
        for c in self._chain_ids:
            stride = self.classes[c].stride
            chain = self._walk_chain(c, block_hashes, top // stride, live)
            top = min(top, (len(chain) - 1) * stride // step * step)
            if top <= 0:
                return Reuse([])
            accepts.append((stride, chain))
            remaining &= chain[step // stride]  # instances that can reuse anything at all
        for c in self._other_ids:
            accepts.append((self.classes[c].stride, self._accepts(c, block_hashes, top, live)))
        return Reuse(_scan(accepts, top, step, remaining, self.hash_block_size))

    def chain_lookup(self, block_hashes: Sequence[bytes], max_tokens: int) -> Reuse:
        """Tokens of the longest cached chain per instance in one class only:
        the first full-attention class (else group 0's class), blocks 0..n-1
        all cached; what a router that ignores the other groups would match."""
        rule = self.classes[self._prefix_class]
        stride = rule.stride
        num_blocks = min(max_tokens // rule.block_size, len(block_hashes) // stride)
        chain = self._walk_chain(self._prefix_class, block_hashes, num_blocks, self.live_mask)
        levels = []
        for n in range(len(chain) - 1, 0, -1):
            dropped = chain[n] & ~chain[n + 1] if n + 1 < len(chain) else chain[n]
            if dropped:
                levels.append((n * rule.block_size, dropped))
        return Reuse(levels)

    def _walk_chain(self, c: int, block_hashes: Sequence[bytes], num_blocks: int,
                    live: int) -> list[int]:
        """[live, holders of block 0, of blocks 0-1, ...] until no instance holds more."""
        stride = self.classes[c].stride
        get = self.tables[c].get
        out = [live]
        cum = live
        for block_hash in block_hashes[stride - 1:num_blocks * stride:stride]:
            cum &= get(block_hash, 0)
            if not cum:
                break
            out.append(cum)
        return out

    def _accepts(self, c: int, block_hashes: Sequence[bytes], top: int, live: int) -> list[int]:
        """Masks of instances whose class `c` accepts n group blocks, n = 0 .. top/stride."""
        rule = self.classes[c]
        stride = rule.stride
        get = self.tables[c].get
        held = [get(h, 0) for h in block_hashes[stride - 1:top:stride]]
        if rule.kind == STATE:
            return [live, *held]
        if rule.kind == WINDOW:
            return window_accepts(held, rule.window, rule.sinks, live)
        assert rule.kind == CHUNK, rule
        return chunk_accepts(held, rule.chunk, live)


def _scan(accepts: list[tuple[int, list[int]]], top: int, step: int, remaining: int,
          hash_block_size: int) -> list[tuple[int, int]]:
    """Candidate lengths (in hash blocks) from `top` down: an instance's answer
    is the first one every class accepts."""
    levels = []
    for length in range(top, 0, -step):
        mask = remaining
        for stride, accept in accepts:
            mask &= accept[length // stride]
        if mask:
            levels.append((length * hash_block_size, mask))
            remaining ^= mask
            if not remaining:
                break
    return levels
