"""Named group mixes of tiny specs: every attention type alone and in hybrid mixes.

Block sizes of 2 to 8 tokens, windows and chunks of a few blocks, sinks and
Mamba checkpoint intervals, so a few dozen tokens cross every boundary a rule
has. The replay digests (`hybridkv.tools.digest`) replay random traffic on
each mix; the test suite's fuzz machine and routing index tests draw from them.

    for name, specs in CONFIGS.items():
        groups = [KVCacheGroupSpec([f"layer.{i}"], s) for i, s in enumerate(specs)]
"""

from __future__ import annotations

from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

Full, Sliding, Chunked = FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec

CONFIGS: dict[str, tuple[KVCacheSpec, ...]] = {
    "full": (Full(4),),
    "sliding": (Sliding(4, sliding_window=6),),
    "chunked": (Chunked(4, attention_chunk_size=8),),
    "mamba": (MambaSpec(4),),
    "full_sliding_mixed_blocks": (Full(8), Sliding(4, sliding_window=9)),
    "full_sliding_small_blocks": (Full(2), Sliding(6, sliding_window=5)),
    "full_chunked": (Full(4), Chunked(2, attention_chunk_size=6)),
    "full_mamba_interval": (Full(4), MambaSpec(4, checkpoint_interval=3)),
    "sliding_mamba_interval": (Sliding(4, sliding_window=5), MambaSpec(4, checkpoint_interval=2)),
    "full_sliding_mamba": (Full(4), Sliding(8, sliding_window=12), MambaSpec(4)),
    "sink_full_sliding": (SinkFullAttentionSpec(4, sink_len=4), Sliding(4, sliding_window=5)),
    "sliding_sinks": (Sliding(4, sliding_window=6, num_sink_tokens=3),),
    "sinks_mamba": (SinkFullAttentionSpec(2, sink_len=4),
                    Sliding(2, sliding_window=3, num_sink_tokens=2), MambaSpec(2)),
}
