"""Engines sharing a real Redis or a directory: reuse across instances and processes,
damaged values, a server that dies mid-run or is not there at all."""

import json
import os
import random
import subprocess
import sys
import textwrap
import warnings

import pytest

from hybridkv import LLM, SamplingParams

BLOCK = 4
pytestmark = pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")


def prompts(seed=0, num_docs=3):
    rng = random.Random(seed)
    docs = [[rng.randrange(3, 512) for _ in range(rng.randrange(50, 70))]
            for _ in range(num_docs)]
    first = [d + [rng.randrange(3, 512) for _ in range(4)] for d in docs]
    again = [d + [rng.randrange(3, 512) for _ in range(5)] for d in docs]
    return first, again


PARAMS = SamplingParams(max_tokens=5, ignore_eos=True)


def tokens(llm, batch):
    return [o.output_token_ids for o in llm.generate(batch, PARAMS)]


@pytest.fixture(scope="module", params=["gemma3-tiny", "jamba-tiny"])
def model(request):
    first, again = prompts()
    ref = LLM(request.param, enable_prefix_caching=False, block_size=BLOCK, num_blocks=512)
    return request.param, tokens(ref, first), tokens(ref, again)


def doc_hit(llm, prompt):
    """The hit a prompt of `again` gets when its document is reusable in full."""
    align = llm.kv.coordinator.alignment
    return (len(prompt) - 5) // align * align


def small_pool(name):
    """About one request's blocks: the next request evicts the one before."""
    llm = LLM(name, block_size=BLOCK, num_blocks=4)
    longest = max(len(p) for batch in prompts() for p in batch) + PARAMS.max_tokens
    need = next(n for n in range(4, 1000)
                if llm.kv.coordinator.max_blocks_held(longest, 2048) <= n - 1)
    return need * 5 // 4


def engine(name, url, **kwargs):
    return LLM(name, block_size=BLOCK, num_blocks=kwargs.pop("num_blocks", 512),
               kv_store=url, poison_kv_cache=True, **kwargs)


def test_a_second_engine_reuses_what_the_first_wrote_to_redis(model, redis_url):
    name, ref_first, ref_again = model
    first, again = prompts()
    a = engine(name, redis_url, kv_store_write_through=True)
    assert tokens(a, first) == ref_first
    a.flush_kv_store()
    b = engine(name, redis_url)
    outs = b.generate(again, PARAMS)
    assert [o.output_token_ids for o in outs] == ref_again
    assert all(o.num_external_cached_tokens == o.num_cached_tokens >= doc_hit(b, p)
               for o, p in zip(outs, again)), [o.num_external_cached_tokens for o in outs]
    stats = b.kv_store_stats()
    assert stats.loaded_blocks > 0 and stats.rejected_blocks == 0
    assert stats.store is not None and stats.store.keys > 0


def test_blocks_evicted_by_one_engine_serve_another(model, redis_url):
    name, ref_first, ref_again = model
    first, again = prompts()
    fillers, _ = prompts(seed=1)
    a = engine(name, redis_url, num_blocks=small_pool(name))  # about one request's blocks
    for p in first + fillers:  # one at a time: each evicts what came before
        tokens(a, [p])
    a.flush_kv_store()  # write-behind: only what the pool evicted is in Redis
    assert a.kv_store_stats().written_blocks > 0
    b = engine(name, redis_url)
    outs = b.generate(again, PARAMS)
    assert [o.output_token_ids for o in outs] == ref_again
    # (a document whose window blocks all stayed in `a`'s pool is not in Redis in full)
    assert sum(o.num_external_cached_tokens >= doc_hit(b, p) for o, p in zip(outs, again)) >= 2, \
        [o.num_external_cached_tokens for o in outs]


def test_damaged_values_planted_in_redis_are_rejected(model, redis_url, redis_server):
    name, ref_first, ref_again = model
    first, again = prompts()
    a = engine(name, redis_url, kv_store_write_through=True)
    tokens(a, first)
    a.flush_kv_store()
    client = redis_server.client()
    keys = client.keys(b"hkv:*")
    assert keys
    for i, key in enumerate(keys):  # flip a byte, truncate, or plant garbage
        value = client.get(key)
        bad = [value[:-1] + bytes([value[-1] ^ 1]), value[:len(value) // 2], b"junk"][i % 3]
        client.set(key, bad)
    b = engine(name, redis_url)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = b.generate(again, PARAMS)
    assert [o.output_token_ids for o in outs] == ref_again
    assert b.kv_store_stats().rejected_blocks > 0
    assert sum("rejected a stored block" in str(w.message) for w in caught) == 1


def test_redis_killed_mid_run(model, own_redis):
    name, ref_first, ref_again = model
    first, again = prompts()
    llm = engine(name, own_redis.url, num_blocks=small_pool(name))
    llm.tier.guard.first_delay = 0.05
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [tokens(llm, [p])[0] for p in first]
        llm.flush_kv_store()
        own_redis.stop()
        got += [tokens(llm, [p])[0] for p in again]
        got += tokens(llm, again)
    assert got == ref_first + ref_again + ref_again
    stats = llm.kv_store_stats()
    assert stats.errors > 0
    assert sum("failed" in str(w.message) for w in caught) == 1
    assert llm.kv.num_free_blocks == llm.config.num_blocks - 1


def test_redis_down_at_start_costs_nothing_but_hits():
    from tests.store.conftest import free_port

    first, _ = prompts()
    url = f"redis://127.0.0.1:{free_port()}/0?timeout=0.2"
    ref = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=small_pool("gemma3-tiny"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=small_pool("gemma3-tiny"),
                  kv_store=url)
        got = [tokens(llm, [p])[0] for p in first + first]
        llm.flush_kv_store()
    assert got == [tokens(ref, [p])[0] for p in first + first]
    assert llm.kv_store_stats().errors > 0
    assert sum("failed" in str(w.message) for w in caught) == 1


def test_a_file_store_serves_a_later_process(tmp_path):
    first, again = prompts(seed=4)
    url = f"file://{tmp_path}/kv?size=64MiB"
    llm = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=url,
              kv_store_write_through=True)
    tokens(llm, first)
    llm.close()
    ref = LLM("gemma3-tiny", enable_prefix_caching=False, block_size=BLOCK, num_blocks=512)
    code = textwrap.dedent(f"""
        import json
        from hybridkv import LLM, SamplingParams
        llm = LLM("gemma3-tiny", block_size={BLOCK}, num_blocks=512, kv_store={url!r})
        outs = llm.generate({again!r}, SamplingParams(max_tokens=5, ignore_eos=True))
        print(json.dumps([[o.output_token_ids, o.num_external_cached_tokens] for o in outs]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r[0] for r in rows] == tokens(ref, again)
    assert all(r[1] >= 48 for r in rows), rows  # documents of 50+ tokens, blocks of 4 and 16
