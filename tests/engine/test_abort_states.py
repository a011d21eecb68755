"""abort_request is valid in every state a request can be in, frees exactly what
the request holds, and changes no other request's greedy output.

Three requests of 20-token prompts and 12 output tokens run on a pool that
holds about one and a half of them, with 8-token chunks, so requests wait,
prefill across steps, decode and get preempted. One is aborted at a chosen
state; the pool's own `check_integrity()` runs after every step, no block is
held once the engine is idle, and the other requests' tokens equal those of
the same run without the abort.
"""

import functools

import pytest
from engine_helpers import smallest_pool

from hybridkv import LLM, SamplingParams

pytestmark = pytest.mark.filterwarnings("ignore:prefix caching:RuntimeWarning")

EXTRA_BLOCKS = {"gemma3-tiny": 4, "jamba-tiny": 3}  # above the smallest pool: preempts once+
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)
PROMPTS = {str(i): list(range(10 + 20 * i, 30 + 20 * i)) for i in range(3)}


@functools.cache
def pool_size(model):
    return smallest_pool(model, 32, 8, block_size=4).config.num_blocks + EXTRA_BLOCKS[model]


def make_llm(model):
    return LLM(model, block_size=4, num_blocks=pool_size(model), max_num_batched_tokens=8)


def run(model, when=None, pick=min):
    """Run the three requests; before every step, until one is aborted, abort
    the `pick` (min or max id) of the requests for which `when(seq, llm)` holds.
    Returns the states, the engine and the aborted id (None: none was)."""
    llm = make_llm(model)
    seqs = {rid: llm.add_request(p, PARAMS, request_id=rid) for rid, p in PROMPTS.items()}
    target = None
    while llm.has_unfinished_requests():
        found = [rid for rid, seq in seqs.items() if when is not None and when(seq, llm)]
        if target is None and found:
            target = pick(found)
            held_before = llm.kv.usage
            assert llm.abort_request(target)
            assert not llm.abort_request(target)  # twice: already gone
            assert llm.kv.usage <= held_before
        llm.step()
        llm.kv.check_integrity()
    return seqs, llm, target


@pytest.fixture(scope="module", params=sorted(EXTRA_BLOCKS))
def reference(request):
    seqs, llm, _ = run(request.param)
    assert llm.stats.preemptions > 0, "the pool must be tight enough to preempt"
    return request.param, {rid: s.request.output_token_ids for rid, s in seqs.items()}


def is_waiting_new(seq, llm):
    return seq in llm.scheduler.waiting and seq.num_preemptions == 0


def is_waiting_preempted(seq, llm):
    return seq in llm.scheduler.waiting and seq.num_preemptions > 0


def is_prefilling(seq, llm):
    computed = seq.request.num_computed_tokens
    return seq in llm.scheduler.running and 0 < computed < seq.request.num_prompt_tokens


def is_decoding(seq, llm):
    return seq in llm.scheduler.running and seq.num_output_tokens >= 3


@pytest.mark.parametrize("when, pick", [
    (is_waiting_new, max), (is_waiting_preempted, min), (is_prefilling, min),
    (is_prefilling, max), (is_decoding, min), (is_decoding, max),
], ids=["waiting-new", "waiting-preempted", "prefill-first", "prefill-last", "decoding-first",
        "decoding-last"])
def test_abort_frees_what_the_request_holds_and_no_output_changes(reference, when, pick):
    model, expected = reference
    seqs, llm, target = run(model, when, pick)
    assert target is not None, "the state was never reached"
    assert seqs[target].finish_reason == "abort"
    assert len(seqs[target].request.output_token_ids) < PARAMS.max_tokens
    for rid, seq in seqs.items():
        if rid != target:
            assert seq.finish_reason == "length"
            assert seq.request.output_token_ids == expected[rid], rid
    assert llm.kv.usage == 0
    assert llm.kv.num_free_blocks == llm.config.num_blocks - 1  # all but the null block


def test_abort_of_a_waiting_request_before_any_step():
    llm = LLM("gemma3-tiny")
    llm.add_request([1, 2, 3, 4], SamplingParams(max_tokens=50), request_id="a")
    b = llm.add_request([5, 6, 7, 8], SamplingParams(max_tokens=5), request_id="b")
    assert llm.abort_request("b")
    assert b.finish_reason == "abort" and b.finished_time is not None
    while llm.has_unfinished_requests():
        llm.step()
    llm.kv.check_integrity()
    assert llm.kv.usage == 0


def test_abort_of_finished_unknown_and_twice_is_refused_and_changes_nothing(reference):
    model, expected = reference
    llm = make_llm(model)
    seq = llm.add_request(PROMPTS["0"], PARAMS, request_id="0")
    while llm.has_unfinished_requests():
        llm.step()
    free = llm.kv.num_free_blocks
    assert not llm.abort_request("0")  # finished
    assert not llm.abort_request("no-such-request")
    assert seq.finish_reason == "length" and seq.request.output_token_ids == expected["0"]
    assert llm.kv.num_free_blocks == free
    llm.kv.check_integrity()
