"""How far before a prompt's end a sliding-window group keeps windows (`TailMargin`)."""

import itertools
import random

import pytest

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
)
from hybridkv.kv_cache.eviction import LOW_VALUE, NORMAL_VALUE
from hybridkv.kv_cache.managers.sliding_window import SlidingWindowManager
from hybridkv.kv_cache.managers.tail_margin import TailMargin

B, WINDOW = 4, 8  # a window of 2 blocks
_ids = itertools.count()


def brute_margin(observed, max_tokens, history):
    """Replays the observations on a plain list: a tail within `max_tokens` (re)enters at
    the recent end unless the request is listed with that tail; the last `history`
    entries count; the margin is their longest tail, `max_tokens` with none."""
    entries = []
    for rid, tail in observed:
        if tail > max_tokens or [rid, tail] in entries:
            continue
        entries = [e for e in entries if e[0] != rid] + [[rid, tail]]
        entries = entries[-history:]
    return max((t for _, t in entries), default=max_tokens)


@pytest.mark.parametrize("seed", range(20))
def test_margin_is_the_longest_recent_tail_within_the_widest(seed):
    rng = random.Random(seed)
    max_tokens, history = rng.choice([0, 16, 192]), rng.randint(1, 6)
    margin = TailMargin(max_tokens, history)
    observed = []
    for _ in range(60):
        rid, tail = f"r{rng.randint(0, 9)}", rng.randint(0, 256)
        observed.append((rid, tail))
        margin.observe(rid, tail)
        margin.check_integrity()
        assert margin.tokens == brute_margin(observed, max_tokens, history)


def test_first_stop_keeps_every_branch_point_within_the_margin():
    margin = TailMargin(max_tokens=6, history=4)
    for prompt in range(0, 40):
        first = margin.first_stop(prompt, B)
        # every branch point p in [prompt - 6, prompt] resumes from the stop p // B
        assert all(first <= p // B for p in range(max(0, prompt - 6), prompt + 1))
        assert first * B <= max(0, prompt - 6) < (first + 1) * B or prompt < 6


@pytest.mark.parametrize("max_tokens, history, name", [(-1, 4, "max_tokens"), (8, 0, "history")])
def test_bad_arguments_are_refused_by_name(max_tokens, history, name):
    with pytest.raises(ValueError, match=name):
        TailMargin(max_tokens, history)


def manager():
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(block_size=B)),
              KVCacheGroupSpec(["s"], SlidingWindowSpec(block_size=B, sliding_window=WINDOW))]
    return KVCacheManager(KVCacheConfig(400, groups), eviction_policy="hybrid")


def run(mgr, prompt):
    """Compute a prompt in one step and free it; its hit and its window group's ids."""
    req = Request(f"r{next(_ids)}", prompt)
    blocks, n = mgr.get_computed_blocks(req)
    assert mgr.allocate_slots(req, req.num_tokens - n, n, blocks if n else None) is not None
    req.num_computed_tokens = req.num_tokens
    ids = mgr.get_block_ids(req.request_id)[1]
    mgr.free(req)
    mgr.check_integrity()
    return n, ids


def ratings(mgr, ids):
    return [mgr.pool.blocks[i].value_hint if i else None for i in ids]



@pytest.mark.both_backends
def test_windows_beyond_the_suffixes_seen_are_low_value():
    # two questions on one document show suffixes of 2 blocks: a later prompt keeps
    # the windows of its last 2 blocks' stops, not of the 48 stops of the widest margin
    assert SlidingWindowManager.tail_margin_tokens // B > 10
    mgr = manager()
    doc, other = list(range(1000, 1240)), list(range(5000, 5240))  # 60 blocks each
    run(mgr, doc + [1] * 8)
    assert run(mgr, doc + [2] * 8)[0] == len(doc)  # branches 8 tokens before its end
    _, ids = run(mgr, other + [3] * 8)
    rated, stop = ratings(mgr, ids), len(other) // B
    assert all(h == NORMAL_VALUE for h in rated[stop - 2:stop + 2])  # the document end's
    assert all(h == LOW_VALUE for h in rated[:stop - 2])  # beyond every suffix seen
    assert run(mgr, other + [4] * 8)[0] == len(other)  # the next question still resumes


@pytest.mark.both_backends
def test_a_branch_within_the_margin_finds_its_stop_kept(monkeypatch):
    # a margin of 6 tokens on a prompt of 41: a prompt sharing its first 35 tokens
    # resumes at the stop 32, whose window is blocks 6 and 7
    monkeypatch.setattr(SlidingWindowManager, "tail_margin_tokens", 6)
    mgr = manager()
    prompt = list(range(100, 141))
    _, ids = run(mgr, prompt)
    assert ratings(mgr, ids)[6:10] == [NORMAL_VALUE] * 4
    assert ratings(mgr, ids)[5] == LOW_VALUE
    assert run(mgr, prompt[:35] + [7] * 6)[0] == 32
