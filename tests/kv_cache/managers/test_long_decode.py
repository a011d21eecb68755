"""Requests decoding far past their window or chunk hold a bounded number of blocks.

Decoding token n (n tokens computed, n + 1 allocated) a request needs, by the
reuse rules: sliding window W, the sink blocks plus the blocks from
floor((n-W+1)/B) up to the one holding token n; chunked C, the blocks of
token n's chunk so far; Mamba, its live state plus the checkpoint the step
writes (a boundary at n + 1 that the retention policy keeps); full, every
block. The counts below are those formulas, checked at every step; the
maxima are the bounds: sliding ceil((W-1)/B) + 1 (+ sink blocks), chunked
C/B, Mamba 2. Mamba also keeps a few prompt states held off its list until
the request ends (`get_retained_block_ids`); they are counted separately.
"""

import pytest

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from hybridkv.kv_cache.managers.mamba import MambaManager
from hybridkv.testing import decode_block_bound

pytestmark = pytest.mark.both_backends  # each test runs on the C and the Python backend


def ceil_div(a, b):
    return -(-a // b)


def sliding_held(spec, n):
    bs, sinks = spec.block_size, ceil_div(spec.num_sink_tokens, spec.block_size)
    first = max(n - spec.sliding_window + 1, 0) // bs
    return sum(1 for p in range(ceil_div(n + 1, bs)) if p < sinks or p >= first)


def chunked_held(spec, n):
    chunk_start = n // spec.attention_chunk_size * spec.attention_chunk_size
    return ceil_div(n + 1, spec.block_size) - chunk_start // spec.block_size


def mamba_held(spec, n):
    return 1 + ((n + 1) % (spec.block_size * spec.checkpoint_interval) == 0)


def mamba_retained(spec, prompt_len):
    """States a request without a hit keeps held off its list until it ends: the
    prompt end's and the written ones on the `prime_interval` grid."""
    grid, prompt_end = MambaManager.prime_interval, prompt_len // spec.block_size
    return sum(1 for j in range(1, prompt_end + 1)
               if j == prompt_end or j % grid == 0 and j % spec.checkpoint_interval == 0)


def retained_count(kv, rid):
    return sum(len(ids) for ids in kv.get_retained_block_ids(rid))


def full_held(spec, n):
    return ceil_div(n + 1, spec.block_size)


def held_formula(spec):
    return {SlidingWindowSpec: sliding_held, ChunkedLocalAttentionSpec: chunked_held,
            MambaSpec: mamba_held, FullAttentionSpec: full_held,
            SinkFullAttentionSpec: full_held}[type(spec)]


def manager(specs, num_blocks=400):
    groups = [KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)]
    return KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy="lru")


def prefill(kv, req, chunk):
    while req.num_computed_tokens < req.num_tokens:
        step = min(chunk, req.num_tokens - req.num_computed_tokens)
        assert kv.allocate_slots(req, step) is not None
        req.num_computed_tokens += step
        kv.check_integrity()


def decode_and_count(kv, req, num_steps):
    """[(n, non-null blocks per group)] right after allocating token n."""
    counts = []
    for _ in range(num_steps):
        n = req.num_computed_tokens
        req.append_output_token_ids(7 + n % 5)
        assert kv.allocate_slots(req, 1) is not None
        counts.append((n, [len(ids) - ids.count(0) for ids in kv.get_block_ids("r")]))
        req.num_computed_tokens += 1
        kv.check_integrity()
    return counts


SPECS = [
    SlidingWindowSpec(4, sliding_window=8),
    SlidingWindowSpec(4, sliding_window=3),  # W < B
    SlidingWindowSpec(4, sliding_window=4),  # W = B
    SlidingWindowSpec(4, sliding_window=10),  # not a multiple of B
    SlidingWindowSpec(1, sliding_window=5),
    SlidingWindowSpec(4, sliding_window=1),
    SlidingWindowSpec(4, sliding_window=6, num_sink_tokens=5),  # 2 sink blocks
    SlidingWindowSpec(3, sliding_window=7, num_sink_tokens=2),
    ChunkedLocalAttentionSpec(4, attention_chunk_size=8),
    ChunkedLocalAttentionSpec(4, attention_chunk_size=4),
    ChunkedLocalAttentionSpec(2, attention_chunk_size=12),
    ChunkedLocalAttentionSpec(1, attention_chunk_size=3),
    MambaSpec(4),
    MambaSpec(4, checkpoint_interval=3),
    MambaSpec(1),
    MambaSpec(8, checkpoint_interval=2),
    FullAttentionSpec(4),
    SinkFullAttentionSpec(4, sink_len=8),
]


def expected_max(spec):
    bs = spec.block_size
    if isinstance(spec, SlidingWindowSpec):
        return ceil_div(spec.num_sink_tokens, bs) + ceil_div(spec.sliding_window - 1, bs) + 1
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return spec.attention_chunk_size // bs
    return 2 if isinstance(spec, MambaSpec) else None


def spec_id(spec):
    fields = ("block_size", "sliding_window", "num_sink_tokens", "attention_chunk_size",
              "checkpoint_interval", "sink_len")
    return type(spec).__name__ + "".join(f"-{getattr(spec, f)}" for f in fields
                                         if hasattr(spec, f))


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
@pytest.mark.parametrize("prompt_len, chunk", [(13, 13), (30, 7)])
def test_blocks_held_while_decoding(spec, prompt_len, chunk):
    kv = manager([spec])
    req = Request("r", list(range(prompt_len)))
    prefill(kv, req, chunk)
    counts = decode_and_count(kv, req, 60)
    formula = held_formula(spec)
    assert [c[0] for _, c in counts] == [formula(spec, n) for n, _ in counts]
    usable = kv.pool.num_blocks - 1 - kv.pool.num_pinned
    retained = mamba_retained(spec, prompt_len) if isinstance(spec, MambaSpec) else 0
    assert retained_count(kv, "r") == retained
    assert kv.num_free_blocks == usable - counts[-1][1][0] - retained
    for n, (held,) in counts:
        bound = decode_block_bound(spec, n + 1)
        assert held <= bound
    top = expected_max(spec)
    if top is not None:  # the bound is reached, and within the stated slack
        assert max(c[0] for _, c in counts) == top


def test_bounds_fit_the_stated_slack():
    for spec in SPECS:
        bs = spec.block_size
        if isinstance(spec, SlidingWindowSpec) and not spec.num_sink_tokens:
            assert expected_max(spec) <= ceil_div(spec.sliding_window - 1, bs) + 2
        if isinstance(spec, ChunkedLocalAttentionSpec):
            assert expected_max(spec) <= spec.attention_chunk_size // bs + 1


def test_hybrid_groups_each_stay_bounded():
    specs = [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=8), MambaSpec(8),
             ChunkedLocalAttentionSpec(4, attention_chunk_size=8)]
    kv = manager(specs)
    req = Request("r", list(range(21)))
    prefill(kv, req, 9)
    counts = decode_and_count(kv, req, 70)
    for n, held in counts:
        assert held == [held_formula(s)(s, n) for s in specs]
    retained = mamba_retained(specs[2], 21)
    assert retained_count(kv, "r") == retained
    assert kv.num_free_blocks == kv.pool.num_blocks - 1 - sum(counts[-1][1]) - retained


def test_released_window_blocks_stay_reusable():
    spec = SlidingWindowSpec(4, sliding_window=8)  # a hit at L needs blocks L/4-2, L/4-1
    kv = manager([spec], 64)
    req = Request("r", list(range(8)))
    prefill(kv, req, 8)
    decode_and_count(kv, req, 40)
    # never-used blocks come first, in order, so position p was computed in block p + 1;
    # the released blocks went to the back of the queue, still cached
    assert kv.get_block_ids("r")[0] == [0] * 10 + [11, 12]  # token 47 reads 40..47
    assert kv.num_free_blocks == 63 - 2
    blocks, hit = kv.get_computed_blocks(Request("q", req.all_token_ids[:20] + [999]))
    assert (blocks.get_block_ids(), hit) == (([0, 0, 0, 4, 5],), 20)
