"""vLLM 0.32's two eviction orders as policies, for the policy grid's baselines.

Written from vLLM's description (`vllm/v1/core/block_pool.py`, `free_blocks`;
`single_type_kv_cache_manager.py`, `reachable_block_mask`), on the public
`EvictionPolicy` interface; vLLM itself is not imported.

- `vllm-dense`: every released block stays cached; a block with no cached data
  goes to the front of the free queue, a cached one to its back, a request's
  blocks tail first. This is `lru`'s order, registered under its own name so
  the grid's tables say what it stands for.
- `vllm-sparse` (vLLM 0.32's default for sliding-window groups): a window
  block is cached only where a hit can resume (the whole window before the
  prompt's end, and before the junction with a shared prefix); every other
  window block released goes to the front of the free queue, like a block with
  no data. Here the sliding-window group rates those blocks `LOW_VALUE` when
  it releases them (with its tail margin set to 0 for this baseline:
  `SPARSE_SETTINGS`), and the policy puts a never-hit low-value block at the
  front, as vLLM does with a block it never hashed.

Differences that remain: vLLM never hashes the blocks it drops, so such a
block cannot serve a hit before it is reused (here it can, until taken), and
vLLM caches the junction's window wherever the hit ended before the prompt's
cached full-attention part; hybridkv's group keeps that window too.
"""

from __future__ import annotations

from collections.abc import Iterable

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.eviction import LOW_VALUE, LRUPolicy, register_eviction_policy
from hybridkv.kv_cache.managers.sliding_window import SlidingWindowManager

# manager settings a baseline runs with: {policy: {class: {attribute: value}}}
SPARSE_SETTINGS = {SlidingWindowManager: {"tail_margin_tokens": 0}}
SETTINGS = {"vllm-sparse": SPARSE_SETTINGS}


class VllmDensePolicy(LRUPolicy):
    """vLLM's free queue with every released block cached (`lru`'s order)."""


class VllmSparsePolicy(LRUPolicy):
    """vLLM's free queue with window blocks cached only where a hit can resume."""

    def add_free(self, blocks: Iterable[Block]) -> None:
        queue = self._queue
        for block in blocks:
            queue[block] = None
            if block.block_hash is None or (block.value_hint == LOW_VALUE
                                            and not block.num_hits):
                queue.move_to_end(block, last=False)


class manager_settings:
    """Context manager: the manager class attributes `policy`'s baseline runs with."""

    def __init__(self, policy: str) -> None:
        self._settings = SETTINGS.get(policy, {})
        self._saved: list[tuple[type, str, object]] = []

    def __enter__(self) -> None:
        for cls, attrs in self._settings.items():
            for name, value in attrs.items():
                self._saved.append((cls, name, cls.__dict__[name]))
                setattr(cls, name, value)

    def __exit__(self, *exc: object) -> None:
        for cls, name, value in reversed(self._saved):
            setattr(cls, name, value)
        self._saved.clear()


register_eviction_policy("vllm-dense", VllmDensePolicy)
register_eviction_policy("vllm-sparse", VllmSparsePolicy)
