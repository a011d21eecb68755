"""`hybridkv simulate` with requests in flight bounded and a trace replayed: against brute force."""

from collections import OrderedDict

import pytest

from hybridkv.kv_cache.specs import FullAttentionSpec
from hybridkv.tools.cli import main
from hybridkv.tools.simulate import TraceRequest, simulate

BLOCK = 4
LAYOUT = {"layers.0": FullAttentionSpec(BLOCK, num_kv_heads=1, head_size=8, dtype="float32")}
PAGE_BYTES = 2 * BLOCK * 8 * 4  # K and V, one head of 8 float32 per slot


def make_trace(num_prompts: int, num_blocks: int) -> list[TraceRequest]:
    """Distinct prompts of `num_blocks` full blocks plus one token, one output token each."""
    prompts = []
    for p in range(num_prompts):
        bits = [1 + (p >> i & 1) for i in range(num_prompts.bit_length())]
        prompts.append(bits + [1] * (num_blocks * BLOCK + 1 - len(bits)))
    return [TraceRequest(prompt, 1) for prompt in prompts]


def brute_force_lru_hit_rate(trace: list[TraceRequest], passes: int, usable_blocks: int) -> float:
    """One request at a time over an LRU block cache, modelled block by block.

    A request reuses its longest cached run of leading full blocks (short of its last token),
    takes the rest from free blocks (unhashed ones first, then the least recently freed cached
    one), and on finishing frees its partial last block unhashed and its full blocks tail first.
    """
    cached: OrderedDict = OrderedDict()  # (prompt, block index) in eviction order
    free_unhashed = usable_blocks
    hits = queries = 0
    for _ in range(passes):
        for request in trace:
            key = tuple(request.prompt)
            full = (len(key) - 1) // BLOCK
            num_hit = 0
            while num_hit < full and (key, num_hit) in cached:
                num_hit += 1
            for i in range(num_hit):
                del cached[(key, i)]
            for _ in range(full + 1 - num_hit):  # full blocks and the partial last one
                if free_unhashed:
                    free_unhashed -= 1
                else:
                    cached.popitem(last=False)
            free_unhashed += 1
            for i in reversed(range(full)):
                cached[(key, i)] = True
            hits += num_hit * BLOCK
            queries += len(key)
    return hits / queries


@pytest.mark.parametrize("num_prompts, usable_blocks", [(3, 12), (4, 12), (5, 20), (6, 13)])
def test_one_in_flight_matches_brute_force_lru(num_prompts, usable_blocks):
    trace = make_trace(num_prompts, 3)
    result = simulate(LAYOUT, (usable_blocks + 1) * PAGE_BYTES, trace, passes=3,
                      max_num_seqs=1, eviction_policy="lru")
    assert result.num_blocks == usable_blocks + 1
    assert result.requests == 3 * num_prompts
    assert result.hit_rate == pytest.approx(brute_force_lru_hit_rate(trace, 3, usable_blocks))


def test_more_in_flight_holds_more_blocks_at_once():
    trace = make_trace(4, 3)
    one = simulate(LAYOUT, 1 << 20, trace, passes=2, max_num_seqs=1)
    four = simulate(LAYOUT, 1 << 20, trace, passes=2, max_num_seqs=4)
    assert one.peak_tokens == 13 and four.peak_tokens == 4 * 13  # one prefill per step vs four
    assert one.hit_rate == four.hit_rate == pytest.approx(12 * 4 / (13 * 8))  # pass 2 hits
    # under pressure, four prompts in flight crowd out the blocks one at a time would reuse
    tight = simulate(LAYOUT, 13 * PAGE_BYTES, trace, passes=3, max_num_seqs=4,
                     eviction_policy="lru")
    assert tight.hit_rate < brute_force_lru_hit_rate(trace, 3, 12) - 0.1


def test_bad_passes_and_max_num_seqs_are_refused(capsys):
    with pytest.raises(ValueError, match="passes"):
        simulate(LAYOUT, 1 << 20, make_trace(2, 1), passes=0)
    assert main(["simulate", "--model", "gemma-3-27b", "--memory", "1GiB",
                 "--max-num-seqs", "0"]) == 2
    assert "--max-num-seqs" in capsys.readouterr().err
    assert main(["simulate", "--model", "gemma-3-27b", "--memory", "1GiB",
                 "--passes", "-1"]) == 2
    assert "--passes" in capsys.readouterr().err
