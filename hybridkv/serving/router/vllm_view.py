"""One vLLM backend's KV cache as the router sees it, learned from its events.

vLLM's block hashes are opaque here: each `BlockStored` names its parent
block and carries the tokens of its blocks, so the view keeps, per vLLM
hash, a record (parent hash, the tokens since the parent, the salt of a
first block) and maps it to a node of the router's own chain: the hash
`compute_block_hashes` gives a prompt at the layout's hash block size
(sha256, the salt in block 0, as for hybridkv backends). Prompts are then
matched by `PrefixIndex` exactly as for hybridkv backends.

Groups are learned from the events: `group_idx`, `kv_cache_spec_kind`,
`kv_cache_spec_sliding_window` and `block_size` of a `BlockStored` give the
group's rule (full attention and unknown kinds: every block before a hit;
sliding window W: the blocks covering the last W tokens; Mamba: the state
at the hit). The layout holds the groups seen so far, in group order; when a
new group appears the backend is registered again with the larger layout
and every block held is stored again in the new index.

A vLLM event skips blocks it does not keep (a sliding window's blocks that
left the window are null): its hashes then name the LAST blocks its tokens
cover. A block whose parent the view never saw (a stream joined midway, a
parent evicted long ago) cannot be placed on the chain and is counted in
`num_unplaced`. Blocks carrying keys the router's prompts never have
(multimodal items, prompt embeddings) get a chain node no prompt matches.
Salts are kept only inside the chain digests, never logged.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from hybridkv.kv_cache.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from hybridkv.kv_cache.hashing import pack_tokens, seed_hash
from hybridkv.kv_cache.specs import FullAttentionSpec, KVCacheSpec, MambaSpec, SlidingWindowSpec
from hybridkv.serving.kv_events_wire import (
    Hash,
    WireAllCleared,
    WireBatch,
    WireBlockRemoved,
    WireBlockStored,
)
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.routing import Router

HASH_ALGO = "sha256"
SEED = seed_hash(HASH_ALGO)
RETIRED = 1 << 16  # records of removed blocks kept, so later children still find them
_WINDOW_KINDS = ("sliding_window", "sliding_window_mla")
UNSURE = b"U\x00\x00\x00\x00"  # extra of a block 0 whose keys were not published


@dataclass(frozen=True, slots=True)
class GroupRule:
    kind: str
    block_size: int
    sliding_window: int | None

    def spec(self) -> KVCacheSpec:
        if self.kind in _WINDOW_KINDS and self.sliding_window:
            return SlidingWindowSpec(self.block_size, sliding_window=self.sliding_window)
        if self.kind == "mamba":
            return MambaSpec(self.block_size)
        return FullAttentionSpec(self.block_size)  # every block needed: never over-credits


@dataclass(frozen=True, slots=True)
class Record:
    """A vLLM block: its parent, the tokens since the parent's end (packed),
    the extra bytes of the first and of every later hash block."""

    parent: Hash | None
    tokens: bytes
    first_extra: bytes
    extra: bytes


def _field(tag: bytes, data: bytes) -> bytes:
    return tag + struct.pack("<I", len(data)) + data


def block_extras(keys: list | tuple | None, lora_name: str | None,
                 first: bool) -> tuple[bytes, bytes]:
    """(extra of the block's first hash block, extra of the others), encoded as
    `hashing.compute_block_hashes` encodes a salt and a LoRA name; keys the
    router's prompts never carry give a marker no prompt hash has."""
    keys = list(keys or ())
    lora = b""
    if lora_name is not None:
        lora = _field(b"L", lora_name.encode())
        if keys and keys[0] == lora_name:
            keys = keys[1:]
    if not keys:
        return lora, lora
    if first and len(keys) == 1 and isinstance(keys[0], str):
        return _field(b"S", keys[0].encode()) + lora, lora
    marker = _field(b"X", hashlib.sha256(repr(keys).encode()).digest())
    return marker + lora, marker + lora


class VllmCacheView:
    """What one vLLM backend caches, kept in step with its entry in `router`."""

    def __init__(self, instance_id: str, router: Router, model: str | None = None) -> None:
        self.instance_id = instance_id
        self.router = router
        self.model = model
        self.rules: dict[int, GroupRule] = {}  # vLLM group idx -> rule
        self.layout_group: dict[int, int] = {}  # vLLM group idx -> layout group
        self.layout: CacheLayout | None = None
        self.records: dict[Hash, Record] = {}
        self.retired: OrderedDict[Hash, Record] = OrderedDict()
        self.held: dict[int, set[Hash]] = {}  # vLLM group idx -> hashes it holds
        self.refs: dict[Hash, int] = {}  # groups holding each record
        self._nodes: dict[Hash, bytes] = {}  # vLLM hash -> router chain node
        self.hash_block_size = 0
        self.num_unplaced = 0
        self.num_batches = 0

    # ---- batches ---------------------------------------------------------------

    def apply(self, batch: WireBatch) -> None:
        """Apply one batch: learn its groups, then its events in order."""
        stored = [e for e in batch.events if isinstance(e, WireBlockStored)]
        self._learn(stored)
        for event in stored:  # whole chains first: they name every block's keys
            if len(event.token_ids) // event.block_size == len(event.block_hashes):
                self._place(event)
        out: list[BlockEvent] = []
        for event in batch.events:
            if isinstance(event, WireBlockStored):
                self._stored(event, out)
            elif isinstance(event, WireBlockRemoved):
                self._removed(event, out)
            elif isinstance(event, WireAllCleared):
                self._clear_records()
                out.append(AllBlocksCleared())
        if out and self.layout is not None:
            self.router.apply_events(self.instance_id, out)
        self.num_batches += 1

    def reset(self) -> None:
        """Forget every block (the backend restarted, or batches were lost)."""
        self._clear_records()
        self.retired.clear()
        if self.layout is not None and self.instance_id in self.router.backends:
            self.router.clear_cache_view(self.instance_id)

    def num_blocks(self) -> int:
        return sum(len(hashes) for hashes in self.held.values())

    # ---- groups ----------------------------------------------------------------

    def _learn(self, events: Iterable[WireBlockStored]) -> None:
        changed = False
        for event in events:
            group = event.group_idx or 0
            rule = GroupRule(event.kv_cache_spec_kind or "unknown", event.block_size,
                             event.kv_cache_spec_sliding_window)
            if self.rules.get(group) != rule:
                self.rules[group] = rule
                changed = True
        if changed:
            self._register()

    def _register(self) -> None:
        """(Re)register the backend with the layout of the groups seen, storing
        every held block again in its (new) index."""
        order = sorted(self.rules)
        self.layout_group = {g: i for i, g in enumerate(order)}
        self.layout = CacheLayout(tuple(self.rules[g].spec() for g in order), HASH_ALGO)
        self.hash_block_size = math.gcd(*(self.rules[g].block_size for g in order))
        self._nodes.clear()
        self.router.add_backend(self.instance_id, self.layout, self.model)
        self.router.clear_cache_view(self.instance_id)
        again: list[BlockEvent] = []
        for group, hashes in self.held.items():
            again += self._store_events(group, hashes)
        if again:
            self.router.apply_events(self.instance_id, again)

    # ---- events ----------------------------------------------------------------

    def _stored(self, event: WireBlockStored, out: list[BlockEvent]) -> None:
        if not self._place(event):
            self.num_unplaced += len(event.block_hashes)
            return
        group, hashes = event.group_idx or 0, event.block_hashes
        held = self.held.setdefault(group, set())
        new = [h for h in hashes if h not in held]
        for h in new:
            held.add(h)
            self.refs[h] = self.refs.get(h, 0) + 1
        out += self._store_events(group, new)

    def _place(self, event: WireBlockStored) -> bool:
        """Records for the event's blocks (those not known yet); False when its
        parent is unknown. An event that skipped its first blocks from the root
        cannot tell the salt of block 0: its blocks get a node no prompt matches
        (unless an event of another group in the batch named them in full)."""
        bs, hashes, tokens = event.block_size, event.block_hashes, event.token_ids
        parent = event.parent_block_hash
        if parent is not None and self._record(parent) is None:
            return False
        first_block = len(tokens) // bs - len(hashes)  # kept blocks are the last ones
        unsure = parent is None and first_block > 0
        extra_keys = event.extra_keys or []
        start = 0
        for j, block_hash in enumerate(hashes):
            end = (first_block + j + 1) * bs
            keys = extra_keys[j] if j < len(extra_keys) else None
            first, rest = block_extras(keys, event.lora_name, parent is None)
            if unsure and j == 0:
                first = UNSURE + first
            self._keep(block_hash, Record(parent, pack_tokens(tokens[start:end]), first, rest))
            parent, start = block_hash, end
        return True

    def _keep(self, block_hash: Hash, record: Record) -> None:
        if block_hash not in self.records:
            self.records[block_hash] = self.retired.pop(block_hash, None) or record

    def _removed(self, event: WireBlockRemoved, out: list[BlockEvent]) -> None:
        groups = [event.group_idx] if event.group_idx is not None else list(self.held)
        for group in groups:
            held = self.held.get(group, set())
            for h in event.block_hashes:
                if h not in held:
                    continue
                node = self._node(h)
                held.discard(h)
                if node is not None and group in self.layout_group:
                    out.append(BlockRemoved(node, self.layout_group[group], 0))
                self._release(h)

    def _release(self, block_hash: Hash) -> None:
        self.refs[block_hash] -= 1
        if self.refs[block_hash] == 0:
            del self.refs[block_hash]
            self.retired[block_hash] = self.records.pop(block_hash)
            if len(self.retired) > RETIRED:
                old, _ = self.retired.popitem(last=False)
                self._nodes.pop(old, None)

    def _clear_records(self) -> None:
        for hashes in self.held.values():
            for h in hashes:
                self._release(h)
            hashes.clear()

    def _store_events(self, group: int, hashes: Iterable[Hash]) -> list[BlockEvent]:
        layout_group = self.layout_group.get(group)
        if layout_group is None:
            return []
        out: list[BlockEvent] = []
        for h in hashes:
            node = self._node(h)
            if node is not None:
                out.append(BlockStored(node, layout_group, 0))
        return out

    # ---- the router's chain ----------------------------------------------------

    def _record(self, block_hash: Hash) -> Record | None:
        return self.records.get(block_hash) or self.retired.get(block_hash)

    def _node(self, block_hash: Hash) -> bytes | None:
        """The router chain node of a vLLM block (None: its chain has a gap)."""
        path: list[tuple[Hash, Record]] = []
        h: Hash | None = block_hash
        while h is not None and h not in self._nodes:
            record = self._record(h)
            if record is None:
                self.num_unplaced += 1
                return None
            path.append((h, record))
            h = record.parent
        node = SEED if h is None else self._nodes[h]
        for h, record in reversed(path):
            node = self._chain(node, record)
            self._nodes[h] = node
        return node

    def _chain(self, parent: bytes, record: Record) -> bytes:
        step = 4 * self.hash_block_size  # packed uint32 tokens
        tokens = record.tokens
        for k in range(0, len(tokens), step):
            extra = record.first_extra if k == 0 and parent == SEED else record.extra
            parent = hashlib.sha256(parent + tokens[k:k + step] + extra).digest()
        return parent
