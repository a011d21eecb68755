"""Which released blocks a group rates low value, and what that means for later hits."""

import itertools
import warnings

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from hybridkv.core.block_pool import JUNCTION, LOW_VALUE, NORMAL_VALUE
from hybridkv.managers.mamba import MambaManager
from hybridkv.managers.sliding_window import SlidingWindowManager

B = 4
_ids = itertools.count()


def manager(side_spec, num_blocks=400):
    groups = [KVCacheGroupSpec(["f"], FullAttentionSpec(block_size=B)),
              KVCacheGroupSpec(["s"], side_spec)]
    return KVCacheManager(KVCacheConfig(num_blocks, groups), eviction_policy="hybrid")


def run(mgr, tokens, num_prompt=None):
    """Compute a request to its end in one step and free it; return its hit."""
    req = Request(f"r{next(_ids)}", tokens[:num_prompt])
    blocks, n = mgr.get_computed_blocks(req)
    assert mgr.allocate_slots(req, req.num_tokens - n, n, blocks if n else None) is not None
    req.num_computed_tokens = req.num_tokens
    ids = mgr.get_block_ids(req.request_id)
    mgr.free(req)
    return n, ids


def hints(mgr, ids):
    return [mgr.pool.blocks[i].value_hint if i else None for i in ids]


def test_window_blocks_near_the_prompt_end_are_kept_the_rest_rated_low():
    window = 8  # 2 blocks of 4
    margin_blocks = SlidingWindowManager.tail_margin_tokens // B
    mgr = manager(SlidingWindowSpec(block_size=B, sliding_window=window))
    prompt = list(range(1000, 1000 + 4 * (margin_blocks + 20)))  # 20 blocks before the tail
    tokens = prompt
    req = Request("a", tokens)
    mgr.allocate_slots(req, len(tokens))
    side = list(mgr.get_block_ids("a")[1])
    req.num_computed_tokens = len(tokens)
    mgr.free(req)
    e = len(prompt) // B
    need = -(-(window - 1) // B)
    rated = hints(mgr, side)
    # a later prompt sharing any stop in the last `margin` tokens finds its window
    assert all(h == NORMAL_VALUE for h in rated[e - need - margin_blocks:e])
    # windows that end further back are dead weight unless someone stops there
    assert all(h == LOW_VALUE for h in rated[:e - need - margin_blocks])


def test_a_question_after_a_long_document_keeps_the_document_end_reusable():
    # a document, then two different questions: the second reuses the whole
    # document, though nothing said the document end was a junction when the
    # first question was computed; the window blocks no stop needs go first
    window = 16
    doc = list(range(5000, 5000 + 4 * 120))  # 120 blocks
    first_question, second_question = [7] * 9, [8] * 6
    hits = {}
    for policy in ("hybrid", "lru"):
        mgr = manager(SlidingWindowSpec(block_size=B, sliding_window=window), 260)
        mgr = KVCacheManager(mgr.config, eviction_policy=policy)
        n1, _ = run(mgr, doc + first_question)
        for k in range(3):  # other work that needs blocks
            run(mgr, list(range(20000 * (k + 1), 20000 * (k + 1) + 4 * 12)))
        hits[policy] = (n1, run(mgr, doc + second_question)[0])
        mgr.check_integrity()
    assert hits["hybrid"] == (0, len(doc))
    assert hits["lru"][1] < len(doc)  # LRU evicted the document's tail first


def test_mamba_states_at_anchors_are_protected_others_rated_low():
    warnings.simplefilter("ignore", RuntimeWarning)
    grid = MambaManager.prime_interval
    mgr = manager(MambaSpec(block_size=B))
    tokens = list(range(3000, 3000 + B * (grid + 5) + 2))  # prompt end at boundary grid + 5
    req = Request("m", tokens)
    mgr.allocate_slots(req, len(tokens))
    states = list(mgr.get_block_ids("m")[1])
    req.num_computed_tokens = len(tokens)
    mgr.free(req)
    rated = hints(mgr, states[:-1])  # the live block caches nothing
    prompt_end = len(tokens) // B
    for j, h in enumerate(rated, start=1):  # entry j - 1: the state after j blocks
        if j == prompt_end or j % grid == 0:
            assert h == JUNCTION, j  # a prompt end or a fallback on the grid
        else:
            assert h == LOW_VALUE, j
