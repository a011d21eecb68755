"""A model-free engine for tier tests: a manager, simulated pages and a KV tier.

A "step" writes into every block it completes a digest of the group and the
request's tokens up to the block's end (what a model would have written:
KV of that prefix, or the state after it), computed from the tokens alone.
At every admission the hit's blocks must hold exactly that digest for the
admitted request: stale, misplaced or mis-keyed data fails there.
"""

from __future__ import annotations

import hashlib
import struct

from hybridkv import KVCacheConfig, KVCacheGroupSpec, KVCacheManager, MambaSpec, Request
from hybridkv.store.pages import SimulatedPages
from hybridkv.store.tier import KVTier

FINGERPRINT = b"sim-fingerprint!"


def content(group_id: int, tokens) -> bytes:
    data = struct.pack(f"<I{len(tokens)}I", group_id, *tokens)
    return hashlib.sha256(data).digest() * 2  # 64 bytes


class SimEngine:
    def __init__(self, specs, num_blocks, store=None, *, select="hybrid", policy="hybrid",
                 budget=1 << 20, write_through=False):
        groups = [KVCacheGroupSpec([f"layer{g}"], s) for g, s in enumerate(specs)]
        self.kv = KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy=policy)
        self.pages = SimulatedPages(num_blocks, len(specs))
        self.tier = None if store is None else KVTier(
            self.kv, store, self.pages, FINGERPRINT, select=select, write_through=write_through)
        self.budget = budget
        self.counter = 0
        self.checked_blocks = 0

    def run(self, prompt, max_tokens=2, next_token=lambda n: 7 + n % 5):
        """One request alone, admitted, prefilled in chunks, decoded, freed.
        Returns (num cached tokens, of which from the store)."""
        self.counter += 1
        req = Request(f"r{self.counter}", prompt)
        blocks, hit = self.kv.get_computed_blocks(req)
        external = 0
        if self.tier is not None:
            blocks, hit, external, _ = self.tier.extend_hit(req, blocks, hit, self.budget,
                                                            can_wait=False)
        self.check_hit(req, blocks, hit)
        n = min(req.num_tokens - hit, self.budget)
        assert self.kv.allocate_slots(req, n, hit, blocks if hit else None) is not None
        self._computed(req, hit, n)
        while req.num_computed_tokens < req.num_tokens:
            n = min(req.num_tokens - req.num_computed_tokens, self.budget)
            assert self.kv.allocate_slots(req, n) is not None
            self._computed(req, req.num_computed_tokens, n)
        for i in range(max_tokens - 1):
            req.append_output_token_ids(next_token(i))
            assert self.kv.allocate_slots(req, 1) is not None
            self._computed(req, req.num_computed_tokens, 1)
        self.kv.free(req)
        self.kv.check_integrity()
        return hit, external

    def _computed(self, req, start, n):
        """The step computed tokens [start, start + n): fill the blocks it completed."""
        end = start + n
        if self.tier is not None:
            self.tier.before_step()  # evicted blocks leave before the step writes
        req.num_computed_tokens = end
        groups = self.kv.get_blocks(req.request_id).blocks
        for g, (spec, blocks) in enumerate(zip(self.kv.config.specs, groups)):
            bs = spec.block_size
            last = len(blocks) - 1 if isinstance(spec, MambaSpec) else len(blocks)
            for i in range(start // bs, min(end // bs, last)):
                block = blocks[i]
                if block is not self.kv.pool.null_block:
                    self.pages.fill(g, block.block_id,
                                    content(g, req.all_token_ids[:(i + 1) * bs]))
        if self.tier is not None:
            self.tier.after_step()

    def check_hit(self, req, blocks, hit):
        for g, (spec, group) in enumerate(zip(self.kv.config.specs, blocks.blocks)):
            assert len(group) * spec.block_size == hit
            for i, block in enumerate(group):
                if block is self.kv.pool.null_block:
                    continue
                want = content(g, req.all_token_ids[:(i + 1) * spec.block_size])
                got = bytes(self.pages.data[g, block.block_id])
                assert got == want, f"group {g} block {i} of the hit holds other data"
                self.checked_blocks += 1
