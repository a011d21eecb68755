"""Which prefixes every instance can reuse, kept from the instances' block events.

One `PrefixIndex` serves all instances of one cache layout. Each instance
owns a slot (a bit); one table maps a block hash to a packed integer with
one field of `width` bits per reuse class (see `layout.ReuseClass`): bit s
of field c is set when the instance in slot s caches the hash in every group
of class c. A lookup hashes nothing: it takes the prompt's block hashes (at
the layout's hash block size, salted as the backends salt them) and answers
for all instances at once with integer masks. It fetches the hashes only as
far as some instance holds the full-attention chain, so a miss costs one
fetch and a hit about one per block it reuses.

The answer is the coordinator's: for each instance, the largest length
L <= max_tokens, a multiple of the lcm of the group block sizes, that every
group's reuse rule accepts given the blocks that instance caches
(`HybridCoordinator.find_longest_cache_hit`; the tests hold the two equal on
random cache states of the real manager).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, repeat
from operator import and_, or_
from typing import NamedTuple

from hybridkv.kv_cache.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from hybridkv.serving.router.layout import CHAIN, CacheLayout
from hybridkv.serving.router.rules import (
    RuleCheck,
    first_zero_field,
    make_check,
    needs_last_block,
)

FIRST_FETCH = 16  # hash blocks fetched before the first check of the chain (then the rest)


class Reuse(NamedTuple):
    """Reusable tokens per instance: `levels` are (tokens, mask of slots),
    longest first; slots in no level reuse nothing."""

    levels: list[tuple[int, int]]

    def tokens(self, slot: int) -> int:
        flag = 1 << slot
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

    def __init__(self, layout: CacheLayout, width: int = 64) -> None:
        self.layout = layout
        self.classes, self.group_class = layout.reuse_classes()
        self.class_size = [self.group_class.count(c) for c in range(len(self.classes))]
        # a group's bit among the groups of its class; all of them: the class's full mask
        self.group_bit = [1 << self.group_class[:g].count(c)
                          for g, c in enumerate(self.group_class)]
        self.class_full = [(1 << size) - 1 for size in self.class_size]
        self.table: dict[bytes, int] = {}
        self.width = width
        self.slots: list[str | None] = []  # slot -> instance id (None: free)
        self.bit_of: dict[str, int] = {}
        # per instance, per class: hash -> mask of the class's groups caching it
        self._held: dict[str, list[dict[bytes, int]]] = {}
        self.live_mask = 0
        self.hash_block_size = layout.hash_block_size
        self._alignment = layout.alignment
        self._step = self._alignment // self.hash_block_size
        self._first_fetch = max(FIRST_FETCH // self._step, 1) * self._step
        self._chain_ids = [c for c, r in enumerate(self.classes) if r.kind == CHAIN]
        self._other_ids = [c for c, r in enumerate(self.classes) if r.kind != CHAIN]
        # field offsets of classes whose every hit needs the block ending at L
        self._last_offs = [c * width for c in self._other_ids
                           if needs_last_block(self.classes[c])]
        # the chain a router unaware of the other groups would match (`chain_lookup`)
        self._prefix_class = self._chain_ids[0] if self._chain_ids else self.group_class[0]
        self.num_unknown_removals = 0

    # ---- instances -------------------------------------------------------------

    def add_instance(self, instance_id: str) -> int:
        """Give `instance_id` a slot (the lowest free one); returns it. Idempotent."""
        if instance_id in self.bit_of:
            return self.bit_of[instance_id]
        slot = self.slots.index(None) if None in self.slots else len(self.slots)
        if slot == len(self.slots):
            self.slots.append(None)
        if slot >= self.width:
            self._widen(2 * self.width)
        self.slots[slot] = instance_id
        self.bit_of[instance_id] = slot
        self._held[instance_id] = [{} for _ in self.classes]
        self.live_mask |= 1 << slot
        return slot

    def remove_instance(self, instance_id: str) -> None:
        """Forget the instance and everything it cached; its slot becomes free."""
        self.clear(instance_id)
        slot = self.bit_of.pop(instance_id)
        del self._held[instance_id]
        self.slots[slot] = None
        self.live_mask &= ~(1 << slot)

    def clear(self, instance_id: str) -> None:
        """The instance caches nothing (AllBlocksCleared)."""
        held = self._held[self._check(instance_id)]
        for c, groups in enumerate(held):
            flag, full = 1 << (c * self.width + self.bit_of[instance_id]), self.class_full[c]
            for block_hash, mask in groups.items():
                if mask == full:
                    self._unset(block_hash, flag)
            groups.clear()

    def num_cached_blocks(self, instance_id: str) -> int:
        """Group blocks the instance caches, as its events tell."""
        return sum(mask.bit_count() for groups in self._held[self._check(instance_id)]
                   for mask in groups.values())

    def held_groups(self, instance_id: str, class_id: int, block_hash: bytes) -> int:
        """Mask of the groups of class `class_id` (bits as in `group_bit`) that
        cache `block_hash` on the instance."""
        return self._held[instance_id][class_id].get(block_hash, 0)

    def _check(self, instance_id: str) -> str:
        if instance_id not in self._held:
            raise KeyError(f"unknown instance {instance_id!r}")
        return instance_id

    def _widen(self, width: int) -> None:
        """Repack every entry with `width` bits per class field."""
        old, full = self.width, (1 << self.width) - 1
        for block_hash, value in self.table.items():
            self.table[block_hash] = sum(((value >> (c * old)) & full) << (c * width)
                                         for c in range(len(self.classes)))
        self.width = width
        self._last_offs = [off // old * width for off in self._last_offs]

    def _unset(self, block_hash: bytes, flag: int) -> None:
        value = self.table[block_hash] & ~flag
        if value:
            self.table[block_hash] = value
        else:
            del self.table[block_hash]

    # ---- events ----------------------------------------------------------------

    def apply_events(self, instance_id: str, events: Iterable[BlockEvent]) -> None:
        """Apply one instance's events in order.

        Raises ValueError for a group id outside the layout (an instance with
        another layout); events before it stay applied. A removal of a hash
        the index never saw stored is counted and ignored (a stream read
        from the middle).
        """
        held = self._held[self._check(instance_id)]
        slot, width, table = self.bit_of[instance_id], self.width, self.table
        group_class, group_bit, class_full = self.group_class, self.group_bit, self.class_full
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
            groups, bit = held[c], group_bit[group_id]
            mask = groups.get(block_hash, 0)
            if kind is BlockStored:
                mask |= bit
                groups[block_hash] = mask
                if mask == class_full[c]:
                    table[block_hash] = table.get(block_hash, 0) | (1 << (c * width + slot))
            elif kind is BlockRemoved:
                if not mask & bit:
                    self.num_unknown_removals += 1
                    continue
                if mask == class_full[c]:
                    self._unset(block_hash, 1 << (c * width + slot))
                if mask == bit:
                    del groups[block_hash]
                else:
                    groups[block_hash] = mask & ~bit

    # ---- lookups ---------------------------------------------------------------

    def lookup(self, block_hashes: Sequence[bytes], max_tokens: int,
               extra: Mapping[bytes, int] | None = None) -> Reuse:
        """Tokens every instance can reuse for a prompt with these block hashes.

        `max_tokens` is the prompt length minus one (a hit leaves at least
        one token to compute). `extra` maps hashes to packed bits counted as
        cached on top of the table's (blocks a shared store holds for the
        instances that can load from it). Example (B=16, full + window of 2 blocks):
        slot 0 caches full blocks 0-3 and window blocks 2-3, slot 1 full 0-3
        and window 0-1; a 65-token prompt -> levels [(64, 0b01), (32, 0b10)].
        """
        step = self._step
        top = min(max_tokens // self._alignment * step, len(block_hashes) // step * step)
        if top <= 0 or not self.live_mask:
            return Reuse([])
        vals, chains = self._fetch(block_hashes, top, extra)
        top = min(top, len(vals) // step * step)
        for stride, off, chain in chains:  # no length past a chain's first gap
            top = min(top, first_zero_field(chain, off, self.width) * stride // step * step)
        if top <= 0:
            return Reuse([])
        checks = [make_check(self.classes[c], c * self.width, self.width, vals, step)
                  for c in self._other_ids]
        return Reuse(self._scan(vals, chains, checks, top))

    def chain_lookup(self, block_hashes: Sequence[bytes], max_tokens: int) -> Reuse:
        """Tokens of the longest cached chain per instance in one class only:
        the first full-attention class (else group 0's class), blocks 0..n-1
        all cached; what a router that ignores the other groups would match."""
        c = self._prefix_class
        rule = self.classes[c]
        top = min(max_tokens // rule.block_size, len(block_hashes) // rule.stride) * rule.stride
        if top <= 0 or not self.live_mask:
            return Reuse([])
        vals = list(map(self.table.get, block_hashes[:top], repeat(0)))
        chain = list(accumulate(vals[rule.stride - 1::rule.stride], and_))
        off, full = c * self.width, (1 << self.width) - 1
        levels, assigned = [], 0
        n = first_zero_field(chain, off, self.width)
        while n > 0:
            mask = (chain[n - 1] >> off) & full & ~assigned
            levels.append((n * rule.block_size, mask))
            assigned |= mask
            n = first_zero_field(chain, off, self.width, ~assigned)
        return Reuse(levels)

    def _fetch(self, block_hashes: Sequence[bytes], top: int,
               extra: Mapping[bytes, int] | None = None,
               ) -> tuple[list[int], list[tuple[int, int, list[int]]]]:
        """Packed values of hash blocks 0.. (up to `top`): the first FIRST_FETCH,
        then the rest while the first chain class holds some instance; and per
        chain class (stride, field offset, running AND over its blocks).
        `extra` (hash -> packed bits) is ORed into the table's values."""
        width = self.width
        get = self._getter(extra)
        if not self._chain_ids:
            return get(block_hashes[:top]), []
        c0 = self._chain_ids[0]
        stride0, off0, full = self.classes[c0].stride, c0 * width, (1 << width) - 1
        first = min(top, self._first_fetch)  # a multiple of the step, so of every stride
        vals = get(block_hashes[:first])
        chain0 = list(accumulate(vals if stride0 == 1 else vals[stride0 - 1::stride0], and_))
        if first < top and (chain0[-1] >> off0) & full:
            rest = get(block_hashes[first:top])
            vals += rest
            more = accumulate(rest if stride0 == 1 else rest[stride0 - 1::stride0], and_,
                              initial=chain0[-1])
            next(more)  # the seed itself
            chain0 += more
        chains = [(stride0, off0, chain0)]
        for c in self._chain_ids[1:]:
            stride = self.classes[c].stride
            chains.append((stride, c * width, list(accumulate(vals[stride - 1::stride], and_))))
        return vals, chains

    def _getter(self, extra: Mapping[bytes, int] | None) -> Callable[[Sequence[bytes]], list[int]]:
        """Hashes -> packed values (the table's, ORed with `extra`'s when given)."""
        table_get = self.table.get
        if not extra:
            return lambda hashes: list(map(table_get, hashes, repeat(0)))
        extra_get = extra.get
        return lambda hashes: list(map(or_, map(table_get, hashes, repeat(0)),
                                       map(extra_get, hashes, repeat(0))))

    def _scan(self, vals: list[int], chains: list[tuple[int, int, list[int]]],
              checks: list[RuleCheck], top: int) -> list[tuple[int, int]]:
        """Candidate lengths (in hash blocks) from `top` down: an instance's answer
        is the first one every class accepts."""
        step, width, hbs = self._step, self.width, self.hash_block_size
        last_offs = self._last_offs
        full = (1 << width) - 1
        remaining = self.live_mask
        for stride, off, chain in chains:  # instances with no chain reuse nothing
            remaining &= chain[step // stride - 1] >> off
        levels = []
        length = top
        while length > 0 and remaining:
            mask = remaining
            for stride, off, chain in chains:
                mask &= chain[length // stride - 1] >> off
            if not mask:  # jump to the longest chain among the remaining instances
                length = self._longest_chain(chains, length - step, remaining)
                continue
            last = vals[length - 1]
            for off in last_offs:
                mask &= last >> off
            next_length = length - step
            for check in checks:
                if not mask:
                    break
                mask = check(length, mask)
                if not mask:  # skip lengths this class refuses to every slot
                    next_length = check.skip(next_length, remaining)
            if mask:
                levels.append((length * hbs, mask & full))
                remaining &= ~mask
            length = next_length
        return levels

    def _longest_chain(self, chains: list[tuple[int, int, list[int]]], below: int,
                       remaining: int) -> int:
        """Largest candidate length <= `below` whose chains hold some of `remaining`."""
        step = self._step
        lo, hi = 0, below // step  # in steps; the answer is in [0, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            mask = remaining
            for stride, off, chain in chains:
                mask &= chain[mid * step // stride - 1] >> off
            if mask:
                lo = mid
            else:
                hi = mid - 1
        return lo * step
