"""Tenant isolation: cache_salt and lora_name separate prefix reuse end to end.

Through `LLM.generate` (dict prompts carrying `cache_salt` / `lora_name`):
two tenants sending the same prompt under different salts reuse nothing of
each other's, in separate calls and within one batch; the same salt hits.
Block events carry a hash, a group and a block id only (never the salt or
tokens). sha256 is the default everywhere, and the hashes equal an
independent sha256 chain over the documented encoding; they do not depend
on the process, PYTHONHASHSEED or the C fast path.
"""

import dataclasses
import hashlib
import inspect
import json
import math
import os
import struct
import subprocess
import sys

import pytest

from hybridkv import (
    LLM,
    BlockStored,
    KVCacheManager,
    SamplingParams,
    compute_block_hashes,
)
from hybridkv.kv_cache.hashing import seed_hash
from hybridkv.models.presets import build_preset_model

BLOCK = 4
PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module", params=["gemma3-tiny", "jamba-tiny"])
def model(request):
    return request.param, build_preset_model(request.param, seed=0)


def engine(model, **kwargs):
    llm = LLM(model, block_size=BLOCK, num_blocks=256, poison_kv_cache=True, **kwargs)
    align = math.lcm(*(g.kv_cache_spec.block_size for g in llm.config.kv_cache_groups))
    return llm, align


def prompt_of(align):
    """One hit unit (a multiple of every group's block size) and a few tokens."""
    return [(7 * i + 3) % 500 + 3 for i in range(max(align, 8) + 3)]


def hit_of(tokens, align):
    return (len(tokens) - 1) // align * align


def cached(llm, *prompts):
    return [o.num_cached_tokens for o in llm.generate(list(prompts), PARAMS)]


@pytest.mark.parametrize("key", ["cache_salt", "lora_name"])
def test_other_tenants_reuse_nothing_and_the_same_tenant_hits(model, key):
    name, hf_model = model
    llm, align = engine(hf_model)
    tokens = prompt_of(align)
    a = {"prompt_token_ids": tokens, key: "tenant-a"}
    b = {"prompt_token_ids": tokens, key: "tenant-b"}
    assert cached(llm, a) == [0]
    assert cached(llm, b) == [0], f"{name}: tenant b reused tenant a's {key} blocks"
    assert cached(llm, tokens) == [0], f"{name}: an unkeyed request reused keyed blocks"
    assert cached(llm, a, b, tokens) == [hit_of(tokens, align)] * 3  # each finds its own
    outs = llm.generate([a, b, tokens], PARAMS)
    assert outs[0].output_token_ids == outs[1].output_token_ids == outs[2].output_token_ids
    assert llm.kv.num_free_blocks == llm.config.num_blocks - 1


def test_tenants_in_one_batch_do_not_share_blocks_cached_in_the_same_step(model):
    _, hf_model = model
    llm, align = engine(hf_model)
    tokens = prompt_of(align)
    batch = [{"prompt_token_ids": tokens, "cache_salt": s} for s in ("a", "b", "a", "b")]
    first = cached(llm, *batch)
    assert first[:2] == [0, 0], first
    assert cached(llm, *batch) == [hit_of(tokens, align)] * 4


def test_block_events_carry_no_salt_and_hash_the_salt_in(model):
    name, hf_model = model
    llm, align = engine(hf_model)
    events = []
    llm.kv.subscribe(events.append)
    tokens = prompt_of(align)
    llm.generate([{"prompt_token_ids": tokens, "cache_salt": "secret-salt"}], PARAMS)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert stored, name
    assert [f.name for f in dataclasses.fields(BlockStored)] == \
        ["block_hash", "group_id", "block_id"]
    for event in stored:
        assert b"secret-salt" not in event.block_hash and "secret-salt" not in repr(event)
    by_group = {}
    for event in stored:
        by_group.setdefault(event.group_id, []).append(event.block_hash)
    small = llm.kv.hash_block_size  # a group with k times larger blocks keys by every k-th
    salted = compute_block_hashes(tokens, small, cache_salt="secret-salt")
    plain = compute_block_hashes(tokens, small)
    for gid, group in enumerate(llm.config.kv_cache_groups):
        k = group.kv_cache_spec.block_size // small
        assert by_group[gid][0] == salted[k - 1] != plain[k - 1], (name, gid)


def test_bad_cache_keys_in_a_prompt_are_rejected_before_anything_runs():
    llm, _ = engine(build_preset_model("gemma3-tiny", seed=0))
    for prompt, match in [({"prompt_token_ids": [5, 6], "cache_salt": 3}, "cache_salt"),
                          ({"prompt_token_ids": [5, 6], "cache_salt": ""}, "cache_salt"),
                          ({"prompt_token_ids": [5, 6], "lora_name": b"x"}, "lora_name"),
                          ({"prompt_token_ids": [5, 6], "tenant": "a"}, "tenant"),
                          ({"cache_salt": "a"}, "prompt_token_ids")]:
        with pytest.raises(ValueError, match=match):
            llm.generate([[5, 6, 7], prompt], PARAMS)
        assert llm.stats.steps == 0 and llm.kv.prefix_cache_stats.queries == 0


# ---- hashing ---------------------------------------------------------------------


def test_sha256_is_the_default_hash():
    for fn in (KVCacheManager, LLM, compute_block_hashes):
        assert inspect.signature(fn).parameters["hash_algo"].default == "sha256", fn
    assert seed_hash("sha256") == hashlib.sha256(b"hybridkv/block-hash/v1").digest()
    tokens = list(range(1000, 1010))
    parent, chain = seed_hash("sha256"), []
    salt = b"S" + struct.pack("<I", 4) + b"acme"
    for i in range(len(tokens) // 4):  # parent || uint32 LE tokens || salt (first block)
        data = parent + struct.pack("<4I", *tokens[4 * i:4 * i + 4]) + (salt if i == 0 else b"")
        parent = hashlib.sha256(data).digest()
        chain.append(parent)
    assert compute_block_hashes(tokens, 4, cache_salt="acme") == chain


HASH_SCRIPT = """
import json, sys
if sys.argv[1] == "no-c":
    sys.modules["hybridkv._native._chainhash"] = None  # force the pure-Python path
from hybridkv import compute_block_hashes
tokens = list(range(3, 70)) + [2**32 - 1]
out = {algo: [h.hex() for h in compute_block_hashes(tokens, 4, hash_algo=algo,
                                                    cache_salt="tenant", lora_name="x")]
       for algo in ("sha256", "xxhash")}
from hybridkv.kv_cache import hashing
out["c_path"] = hashing._chainhash is not None
print(json.dumps(out))
"""


def hashes_in_subprocess(hash_seed, mode="c"):
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", HASH_SCRIPT, mode], env=env, cwd=root,
                          capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout)


def test_hashes_do_not_depend_on_the_process_or_python_hash_seed():
    tokens = list(range(3, 70)) + [2**32 - 1]
    here = {algo: [h.hex() for h in compute_block_hashes(tokens, 4, hash_algo=algo,
                                                         cache_salt="tenant", lora_name="x")]
            for algo in ("sha256", "xxhash")}
    assert len(here["sha256"]) == 17 and len(set(here["sha256"])) == 17
    runs = [hashes_in_subprocess(seed) for seed in ("0", "1", "4242")]
    python_path = hashes_in_subprocess("random", mode="no-c")
    assert python_path.pop("c_path") is False
    for run in [*runs, python_path]:
        run.pop("c_path", None)
        assert run == here
