"""The engine with a KV store on pools small enough to evict: the same greedy tokens and
logits as without caching at all, and documents pushed out of the pool come back
from the store.

Every run has `poison_kv_cache=True` (blocks are NaN whenever they stop holding
valid data), so a block imported with the wrong data, into the wrong place, or
read before it arrived shows up as NaN or as different logits.
"""

import dataclasses
import random

import pytest
import torch

from hybridkv import LLM, KVCacheManager, SamplingParams
from hybridkv.models.presets import build_preset_model
from hybridkv.store import CpuStore
from hybridkv.testing.models import slow_decay

PRESETS = ["gemma3-tiny", "gpt-oss-tiny", "jamba-tiny", "llama4-tiny", "nemotron-h-tiny"]
BLOCK = 4
ATOL = 2e-4
pytestmark = pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")


def rounds(seed=0):
    """Batches of (prompt, max_tokens): three documents with questions, six other
    documents that push them out of a small pool, then the first three again
    with new questions; documents cross the windows and chunks (32 tokens)."""
    rng = random.Random(seed)

    def toks(n):
        return [rng.randrange(3, 512) for _ in range(n)]

    docs = [toks(rng.randrange(44, 70)) for _ in range(3)]
    others = [toks(rng.randrange(40, 60)) for _ in range(6)]
    return [
        [(d + toks(5), 4) for d in docs],
        [(o + toks(3), 3) for o in others[:3]],
        [(o + toks(3), 3) for o in others[3:]],
        [(d + toks(6), 6) for d in docs] + [(docs[0] + toks(2), 30)],
    ]


def run(llm, batches):
    """Outputs and per-request logits of every batch, in order."""
    seen: dict[str, list[torch.Tensor]] = {}
    sample = llm.sampler.sample

    def recording(logits, request_id, params, salt=0):
        seen.setdefault(request_id, []).append(logits.detach().float().clone())
        return sample(logits, request_id, params, salt)

    llm.sampler.sample = recording
    outs, logits = [], []
    for batch in batches:
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for _, n in batch]
        for out in llm.generate([p for p, _ in batch], params):
            outs.append(out)
            logits.append(torch.stack(seen.pop(out.request_id)))
    return outs, logits


def small_pool(model, batches, budget):
    """Twice the fewest blocks that fit the longest request: several requests run,
    and every round evicts."""
    config = LLM(model, block_size=BLOCK, num_blocks=4).config
    longest = max(len(p) + n for batch in batches for p, n in batch)
    for num_blocks in range(4, 2000):
        if KVCacheManager(dataclasses.replace(config, num_blocks=num_blocks)).can_fit(
                longest, budget):
            return 2 * num_blocks
    raise AssertionError("no pool fits")


@pytest.fixture(scope="module", params=PRESETS)
def preset(request):
    model = build_preset_model(request.param, seed=0)
    slow_decay(model)
    batches = rounds()
    reference = LLM(model, enable_prefix_caching=False, block_size=BLOCK, num_blocks=1024,
                    poison_kv_cache=True)
    return request.param, model, batches, run(reference, batches)


@pytest.mark.parametrize("budget", [16, 64])
def test_same_tokens_with_a_store_and_documents_come_back_from_it(preset, budget):
    name, model, batches, (ref_outs, ref_logits) = preset
    num_blocks = small_pool(model, batches, budget)
    store = CpuStore(64 << 20)
    llm = LLM(model, block_size=BLOCK, num_blocks=num_blocks, max_num_batched_tokens=budget,
              max_num_seqs=4, poison_kv_cache=True, kv_store=store)
    outs, logits = run(llm, batches)
    where = f"{name}, {num_blocks} blocks, budget {budget}"
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in ref_outs], where
    for got, want in zip(logits, ref_logits):
        assert torch.isfinite(got).all(), f"{where}: NaN logits (a poisoned block was read)"
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=where)
    last = outs[-4:]  # the documents asked again after being pushed out
    assert llm.stats.evictions > 0, where
    assert all(o.num_external_cached_tokens > 0 for o in last[:3]), \
        f"{where}: {[(o.num_cached_tokens, o.num_external_cached_tokens) for o in last]}"
    for o in outs:
        assert 0 <= o.num_external_cached_tokens <= o.num_cached_tokens < len(o.prompt_token_ids)
    stats = llm.kv_store_stats()
    assert stats.hit_tokens == sum(o.num_external_cached_tokens for o in outs) > 0
    assert stats.rejected_blocks == 0 and stats.errors == 0 and stats.loaded_blocks > 0
    assert llm.kv.num_free_blocks == llm.config.num_blocks - 1, f"{where}: leaked blocks"
    llm.kv.check_integrity()
    llm.close()


def test_without_a_store_the_same_pool_recomputes_those_documents(preset):
    name, model, batches, (ref_outs, _) = preset
    num_blocks = small_pool(model, batches, 64)
    llm = LLM(model, block_size=BLOCK, num_blocks=num_blocks, max_num_batched_tokens=64,
              max_num_seqs=4, poison_kv_cache=True)
    outs, _ = run(llm, batches)
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in ref_outs]
    assert all(o.num_external_cached_tokens == 0 for o in outs)
    with_store = LLM(model, block_size=BLOCK, num_blocks=num_blocks, max_num_batched_tokens=64,
                     max_num_seqs=4, kv_store="cpu://?size=64MiB")
    tiered, _ = run(with_store, batches)
    assert sum(o.num_cached_tokens for o in tiered[-4:]) > sum(o.num_cached_tokens
                                                              for o in outs[-4:]), name


def test_write_through_serves_a_second_engine(preset):
    """Blocks written when computed (nothing evicted): a second engine on the same
    store reuses the first one's documents with the same tokens."""
    name, model, batches, (ref_outs, _) = preset
    store = CpuStore(64 << 20)
    first = LLM(model, block_size=BLOCK, num_blocks=1024, kv_store=store,
                kv_store_write_through=True)
    run(first, batches[:1])
    first.flush_kv_store()
    assert first.stats.evictions == 0
    second = LLM(model, block_size=BLOCK, num_blocks=1024, kv_store=store)
    outs, _ = run(second, [batches[0]])
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in ref_outs[:3]]
    assert all(o.num_external_cached_tokens == o.num_cached_tokens > 0 for o in outs), name


def test_cache_salts_and_models_keep_stored_blocks_apart():
    """The same tokens under another cache salt, or on another model, never come
    from the store; under the same salt they do."""
    store = CpuStore(64 << 20)
    doc = list(range(10, 80))
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    first = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=store,
                kv_store_write_through=True)
    first.generate([{"prompt_token_ids": doc + [1], "cache_salt": "tenant-a"}], params)
    first.flush_kv_store()

    def external(llm, salt):
        out = llm.generate([{"prompt_token_ids": doc + [2], "cache_salt": salt}], params)[0]
        return out.num_external_cached_tokens

    same = LLM("gemma3-tiny", block_size=BLOCK, num_blocks=512, kv_store=store)
    assert external(same, "tenant-b") == 0
    assert external(same, "tenant-a") > 0
    other_model = LLM("gemma3-tiny", seed=1, block_size=BLOCK, num_blocks=512, kv_store=store)
    assert external(other_model, "tenant-a") == 0
