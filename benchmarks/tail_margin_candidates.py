"""Rating candidates for sliding-window groups (tail margin variants), as policies.

Each candidate is `hybrid`'s order (HybridPolicy) under its own name, with the
sliding-window manager's `rate_released` / `protects` swapped in while that policy
runs (vllm_policies.SETTINGS, applied by manager_settings). `NAME@lru` runs the
same ratings with rules 3 and 4 off (LRU order with the empty, low-value and
protected queues). `base` is the fixed 192-token margin, as the default was before
the margin followed the suffixes seen.

    python benchmarks/bench_policy_grid.py --quick --kinds swa --workers 1 \
        --plugin benchmarks/tail_margin_candidates.py --policies hybrid,m-learned2
"""
from __future__ import annotations

from collections import deque

import vllm_policies

from hybridkv.kv_cache.eviction import JUNCTION, LOW_VALUE, NORMAL_VALUE, register_eviction_policy
from hybridkv.kv_cache.eviction.hybrid import HybridPolicy, HybridRules
from hybridkv.kv_cache.managers.sliding_window import SlidingWindowManager as SWM

MARGIN = 192
HISTORY = 64


class LruRatings(HybridPolicy):
    rules = HybridRules(hits_kept=False, cycle_guard=False)


# ---- where the kept tail windows start (first kept block index) ----------------

def lo_base(self, request):
    bs, need = self.block_size, self.spec.num_window_blocks
    return request.num_prompt_tokens // bs - need - MARGIN // bs


def lo_minus_bs(self, request):  # margin = max(0, 192 - block size) tokens
    bs, need = self.block_size, self.spec.num_window_blocks
    return request.num_prompt_tokens // bs - need - max(0, MARGIN - bs) // bs


def lo_one_block(self, request):  # at most one block of margin
    bs, need = self.block_size, self.spec.num_window_blocks
    return request.num_prompt_tokens // bs - need - min(1, MARGIN // bs)


def lo_end_only(self, request):  # the prompt end's window only
    bs, need = self.block_size, self.spec.num_window_blocks
    return request.num_prompt_tokens // bs - need


def observe(self, request, junction):
    """Record once per request how far before its prompt end it branched off
    cached data (only where prompts branch)."""
    seen = self.__dict__.setdefault("_seen", {})
    if request.request_id in seen or junction <= 0:
        return
    if len(seen) > 4096:
        seen.clear()
    seen[request.request_id] = None
    if not self.branches_at(request, junction):
        return
    tail = max(0, request.num_prompt_tokens - junction)
    tails = self.__dict__.setdefault("_tails", deque(maxlen=HISTORY))
    tails.append(tail if tail <= MARGIN else -1)


def observe_within(self, request, junction):
    """As `observe`, but a branch beyond the margin is not recorded."""
    seen = self.__dict__.setdefault("_seen", {})
    if request.request_id in seen or junction <= 0:
        return
    if len(seen) > 4096:
        seen.clear()
    seen[request.request_id] = None
    tail = max(0, request.num_prompt_tokens - junction)
    if tail > MARGIN or not self.branches_at(request, junction):
        return
    self.__dict__.setdefault("_tails", deque(maxlen=HISTORY)).append(tail)


def learned_margin(self):
    tails = self.__dict__.get("_tails")
    if not tails:
        return MARGIN  # nothing seen yet
    return max(0, max(tails))


def lo_exact(self, request):  # stops within the last 192 tokens (exact stops)
    bs, need = self.block_size, self.spec.num_window_blocks
    return (request.num_prompt_tokens - MARGIN) // bs - need


def lo_learned(self, request):  # stops within the learned margin (exact stops)
    bs, need = self.block_size, self.spec.num_window_blocks
    return (request.num_prompt_tokens - learned_margin(self)) // bs - need


# ---- rules built from a `lo` ----------------------------------------------------

def make(lo_keep, lo_protect=None, learn=None):
    """rate_released / protects keeping tail windows from lo_keep(request); blocks in
    [lo_protect, lo_keep) are protected while the request runs but rated low value."""
    lo_protect = lo_protect or lo_keep

    def protects(self, request, junction, i, block):
        if block.num_hits:
            return True
        bs, need = self.block_size, self.spec.num_window_blocks
        shared = junction // bs
        if shared - need <= i < shared:
            return True
        return lo_protect(self, request) <= i < request.num_prompt_tokens // bs

    def rate_released(self, request, junction, blocks, start, end):
        if learn:
            learn(self, request, junction)
        bs, need, null = self.block_size, self.spec.num_window_blocks, self.null_block
        shared = junction // bs
        j_lo = shared - need
        at_junction = JUNCTION if 2 * need <= shared and start < shared and end > j_lo \
            and self.branches_at(request, junction) else NORMAL_VALUE
        prompt = request.num_prompt_tokens // bs
        t_lo = lo_keep(self, request)
        head = min(end, self.num_kept_head_blocks)
        skipped = self.num_skipped.get(request.request_id, head)
        for lo, hi in ((start, head), (max(start, skipped, head), end)):
            for i in range(lo, hi):
                block = blocks[i]
                if block is null:
                    continue
                if j_lo <= i < shared:
                    block.value_hint = at_junction
                elif not t_lo <= i < prompt:
                    block.value_hint = LOW_VALUE
                if i < shared and not block.num_hits and block.value_hint != LOW_VALUE:
                    block.num_hits = 1

    return {"rate_released": rate_released, "protects": protects}


CANDIDATES = {
    "base": make(lo_base),  # a re-implementation of the default: must equal `hybrid`
    "m-minus-bs": make(lo_minus_bs),
    "m-1blk": make(lo_one_block),
    "m-learned": make(lo_learned, learn=observe),
    "m-exact": make(lo_exact),
    "m-learned2": make(lo_learned, learn=observe_within),
    "m-lowtail": make(lo_end_only, lo_protect=lo_base),
    "m-learned-low": make(lo_learned, lo_protect=lo_base, learn=observe),
}

for name, attrs in CANDIDATES.items():
    register_eviction_policy(name, HybridPolicy)
    vllm_policies.SETTINGS[name] = {SWM: attrs}
    register_eviction_policy(name + "@lru", LruRatings)
    vllm_policies.SETTINGS[name + "@lru"] = {SWM: attrs}
register_eviction_policy("lru-ratings", LruRatings)
