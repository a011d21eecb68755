"""Full attention with learned sink KV slots shared by every request."""

from __future__ import annotations

from typing import ClassVar

from hybridkv.kv_cache.block_pool import Block, BlockPool
from hybridkv.kv_cache.managers.full import FullAttentionManager
from hybridkv.kv_cache.specs import KVCacheSpec, SinkFullAttentionSpec


class SinkFullAttentionManager(FullAttentionManager):
    """Full attention whose `sink_len` sink slots live in blocks taken from the
    pool once at start-up, shared by every request, never freed or evicted.

    Request block lists do not include the sink blocks; the runner reads them
    from `sink_block_ids`.
    """

    spec_class: ClassVar[type[KVCacheSpec]] = SinkFullAttentionSpec

    def __init__(self, spec: SinkFullAttentionSpec, group_id: int, pool: BlockPool,
                 hash_block_size: int, enable_caching: bool = True) -> None:
        super().__init__(spec, group_id, pool, hash_block_size, enable_caching)
        if spec.num_sink_blocks > pool.num_free_blocks:
            raise ValueError(f"the pool has {pool.num_free_blocks} free blocks, fewer than "
                             f"the {spec.num_sink_blocks} sink blocks of group {group_id}")
        self.sink_blocks = pool.pin_blocks(spec.num_sink_blocks)

    @property
    def sink_block_ids(self) -> list[int]:
        return [b.block_id for b in self.sink_blocks]

    def pinned_blocks(self) -> list[Block]:
        return self.sink_blocks
