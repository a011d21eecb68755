"""The manager's repeated-miss warning with a KV store: a prompt start the pool keeps
missing but the store serves is reused, so it must not be reported as a miss; one the
store cannot serve (down) still is."""

import warnings

import pytest

from hybridkv import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from hybridkv.kv_cache.kv_cache_manager import REPEATED_MISS_WARNING
from hybridkv.store import CpuStore, StoreError
from tests.store.sim import SimEngine

SPECS = {
    "full": [FullAttentionSpec(4)],
    "full+swa": [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=10)],
    "full+mamba": [FullAttentionSpec(4), MambaSpec(4)],
}
DOC = list(range(3, 43))  # 40 tokens: 10 blocks of 4


class DownStore(CpuStore):
    """A store whose every call fails (a server that is down)."""

    def __getattribute__(self, name):
        if name in ("get", "put", "put_blocks", "put_pages", "contains", "prefix_length",
                    "prefix_length_blocks", "contains_blocks", "delete"):
            def down(*args, **kwargs):
                raise StoreError("down")
            return down
        return super().__getattribute__(name)


def ask_again_and_again(eng, times):
    """The document, then enough other prompts to push it out of the pool, `times`
    times; (pool misses of the document, tokens the store gave it, warnings)."""
    pool_misses, external = 0, 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(times):
            hit, from_store = eng.run(DOC + [1 + i])
            pool_misses += hit == from_store  # the pool's own lookup found nothing
            external += from_store
            for j in range(4):  # 4 x 40 other tokens: the pool keeps none of the document
                eng.run([1000 + 200 * i + 50 * j + t for t in range(40)])
    misses = [w for w in caught if "found nothing reusable" in str(w.message)]
    return pool_misses, external, misses


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_prefix_the_store_serves_is_not_a_repeated_miss(name):
    specs = SPECS[name]
    eng = SimEngine(specs, num_blocks=16 * len(specs), store=CpuStore(1 << 24), policy="lru")
    pool_misses, external, misses = ask_again_and_again(eng, 2 * REPEATED_MISS_WARNING)
    assert pool_misses >= REPEATED_MISS_WARNING  # the pool alone would have warned
    assert external > 0 and eng.tier.stats().hit_requests >= REPEATED_MISS_WARNING
    assert misses == [] and eng.kv.prefix_cache_stats.repeated_miss_prefixes == 0


@pytest.mark.parametrize("store", [None, "down"])
def test_without_a_working_store_the_repeated_miss_still_warns(store):
    specs = SPECS["full+swa"]
    eng = SimEngine(specs, num_blocks=32, store=None if store is None else DownStore(1 << 24),
                    policy="lru")
    pool_misses, external, misses = ask_again_and_again(eng, 2 * REPEATED_MISS_WARNING)
    assert external == 0 and pool_misses == 2 * REPEATED_MISS_WARNING
    assert len(misses) == 1 and eng.kv.prefix_cache_stats.repeated_miss_prefixes >= 1
