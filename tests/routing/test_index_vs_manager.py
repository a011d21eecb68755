"""The router's index against the real manager: fed an instance's block events,
`PrefixIndex.lookup` must give exactly `get_computed_blocks`' token count."""

from __future__ import annotations

import random
import zlib

import pytest
from routing_helpers import MAX_TOKENS, Instance, PromptSource, make_config, new_index, pool_for

from hybridkv.kv_cache.hashing import compute_block_hashes
from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from hybridkv.serving.router import rules
from hybridkv.testing.oracles import cached_positions
from hybridkv.tools.spec_mixes import CONFIGS

EXTRA_CONFIGS = {
    # groups of one spec form one reuse class: a hash counts when all of them cache it
    "two_sliding_groups_full": (FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=7),
                                SlidingWindowSpec(4, sliding_window=7)),
    # a full group whose block is 5 hash blocks long (Jamba's 160 over 16-token states)
    "mamba_full_stride5": (MambaSpec(2), MambaSpec(2), FullAttentionSpec(10)),
    "window_one_token": (FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=1)),
    "sliding_mamba_no_full": (SlidingWindowSpec(4, sliding_window=9), MambaSpec(4)),
    "chunked_sinkfull": (SinkFullAttentionSpec(4, sink_len=8),
                         ChunkedLocalAttentionSpec(4, attention_chunk_size=12)),
}
ALL_CONFIGS = {**CONFIGS, **EXTRA_CONFIGS}


def _check_lookups(index, instances, source, rng, hash_algo, salts) -> int:
    checked = 0
    for _ in range(25):
        prompt = source.prompt()
        salt = rng.choice(salts)
        hashes = compute_block_hashes(prompt, index.hash_block_size, hash_algo=hash_algo,
                                      cache_salt=salt)
        reuse = index.lookup(hashes, len(prompt) - 1)
        for inst in instances:
            expected = inst.computed_tokens(prompt, salt)
            got = reuse.tokens(index.bit_of[inst.name])
            assert got == expected, (inst.name, prompt, salt, got, expected)
            checked += expected > 0
    return checked


@pytest.mark.parametrize("policy", ["hybrid", "lru"])
@pytest.mark.parametrize("name", sorted(ALL_CONFIGS))
def test_lookup_equals_get_computed_blocks(name, policy, monkeypatch):
    """Random cache states; also with windows and chunks always checked by their
    whole answer (DIRECT_BUDGET 0) and with 2-bit fields the index must widen."""
    rng = random.Random(zlib.crc32(f"{name}-{policy}".encode()))
    if policy == "lru":
        monkeypatch.setattr(rules, "DIRECT_BUDGET", 0)
    specs = ALL_CONFIGS[name]
    hash_algo = rng.choice(["sha256", "xxhash"])
    source = PromptSource(rng)
    num_blocks = pool_for(specs, source.max_prompt + MAX_TOKENS, rng.uniform(1.1, 2.5))
    config = make_config(specs, num_blocks)
    index = new_index(config, hash_algo, width=rng.choice([2, 64]))
    instances = [Instance(f"i{k}", config, index, eviction_policy=policy,
                          hash_algo=hash_algo) for k in range(3)]
    salts = [None, None, "tenant-a"]
    hits = 0
    for round_ in range(8):
        for inst in instances:
            batch = [source.prompt() for _ in range(rng.randint(1, 4))]
            source.remember(inst.run(batch, rng, source.vocab,
                                     [rng.choice(salts) for _ in batch]))
        if round_ == 5:  # lose cached data out of order on one instance
            kv = instances[0].kv
            kv.evict_blocks(rng.sample(range(1, config.num_blocks), 10))
            instances[0].flush()
        if round_ == 6:  # an emptied cache (AllBlocksCleared)
            assert instances[1].kv.reset_prefix_cache()
            instances[1].flush()
        hits += _check_lookups(index, instances, source, rng, hash_algo, salts)
    assert hits > 10, "the random states gave too few hits to test anything"


@pytest.mark.parametrize("name", ["full_sliding_mamba", "sliding", "mamba_full_stride5"])
def test_chain_lookup_is_the_first_chain_groups_run(name):
    """`chain_lookup`: consecutive cached blocks of the first full-attention group
    (else group 0) from block 0, per instance, as the pool's hash map shows."""
    rng = random.Random(7)
    specs = ALL_CONFIGS[name]
    source = PromptSource(rng)
    config = make_config(specs, pool_for(specs, source.max_prompt + MAX_TOKENS, 1.5))
    index = new_index(config)
    instances = [Instance(f"i{k}", config, index) for k in range(3)]
    for _ in range(5):
        for inst in instances:
            source.remember(inst.run([source.prompt() for _ in range(3)], rng, source.vocab))
    group = next((g for g, s in enumerate(specs) if isinstance(s, FullAttentionSpec)), 0)
    bs = specs[group].block_size
    stride = bs // index.hash_block_size
    seen = 0
    for _ in range(40):
        prompt = source.prompt()
        hashes = compute_block_hashes(prompt, index.hash_block_size)
        reuse = index.chain_lookup(hashes, len(prompt) - 1)
        for inst in instances:
            cached = cached_positions(inst.kv.pool, group, hashes, stride)
            n = 0
            while n in cached and (n + 1) * bs <= len(prompt) - 1:
                n += 1
            assert reuse.tokens(index.bit_of[inst.name]) == n * bs
            seen += n > 0
    assert seen > 5
