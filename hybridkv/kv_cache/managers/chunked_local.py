"""Chunked local attention (Llama 4): a token sees only its own chunk."""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.kv_cache.block_pool import Block
from hybridkv.kv_cache.managers.base import Lookup, SingleTypeManager, cached_run
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import ChunkedLocalAttentionSpec


class ChunkedLocalAttentionManager(SingleTypeManager):
    """A token at position p sees positions floor(p/C)*C .. p.

    Reusable at L when blocks floor(L/C)*C/B .. L/B-1 are cached, so any
    multiple of C is reusable with nothing cached. The search puts nulls up
    to the chunk start of `max_length`, then goes left to right to the first
    miss: C=8, B=4, L=12 -> `[null, null, b9]`.
    """

    spec_class = ChunkedLocalAttentionSpec
    accepts_lookup = True
    spec: ChunkedLocalAttentionSpec

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               lookup: Lookup | None = None) -> list[Block]:
        bs, stride = self.block_size, self.stride
        num_blocks = min(max_length // bs, len(block_hashes) // stride)
        chunk = self.spec.attention_chunk_size
        chunk_start = num_blocks * bs // chunk * chunk // bs
        return [self.null_block] * chunk_start + cached_run(
            lookup or self.cached_block, block_hashes, stride, chunk_start, num_blocks)

    def num_skipped_blocks(self, request: Request, num_computed_tokens: int) -> int:
        chunk = self.spec.attention_chunk_size
        return num_computed_tokens // chunk * chunk // self.block_size

    def max_quiet_computed(self, request: Request) -> int:
        # floor(c / C) * C / B <= start  <=>  floor(c / C) <= start * B // C
        start = self.num_skipped.get(request.request_id, 0)
        chunk = self.spec.attention_chunk_size
        return (start * self.block_size // chunk + 1) * chunk - 1

    def max_blocks_held(self, num_tokens: int, max_chunk_tokens: int) -> int:
        span = self.spec.attention_chunk_size + min(num_tokens, max_chunk_tokens)
        return min(-(-num_tokens // self.block_size), span // self.block_size + 2)
