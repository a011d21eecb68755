"""Paged attention (torch path) against dense references (Hugging Face's eager attention:
test_attention_hf.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from hybridkv.kernels import attention, attention_batched, decode_native
from hybridkv.kernels.attention import AttentionBatch, MaskRules, paged_attention, write_kv
from hybridkv.kernels.attention_batched import Tile, group_tiles, plan_tiles
from hybridkv.kernels.attention_flash import can_use_flash_attention

HEAD_DIM = 8
NULL_BLOCK = 0


@dataclass
class Case:
    """A batch laid out in a paged cache, plus the dense K/V each sequence really has."""

    query: torch.Tensor  # [num_tokens, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, B, Hkv, D]
    v_cache: torch.Tensor
    batch: AttentionBatch
    keys: list[torch.Tensor]  # per sequence [seq_len, Hkv, D]
    values: list[torch.Tensor]


def is_visible(p: int, k: int, window=None, num_sinks=0, chunk=None) -> bool:
    """The masking rules, written out one pair at a time."""
    if k > p:
        return False
    if window is not None and k <= p - window and k >= num_sinks:
        return False
    return chunk is None or k // chunk == p // chunk


def first_needed_block(seq_len, num_new, block_size, window, chunk) -> int:
    """Index of the first block the earliest new query may read (earlier ones become null)."""
    first_pos = seq_len - num_new
    first = 0
    if window is not None:
        first = max(first, first_pos - window + 1)
    if chunk is not None:
        first = max(first, first_pos // chunk * chunk)
    return first // block_size


def make_case(seqs, *, block_size, num_q_heads=4, num_kv_heads=2, dtype=torch.float32,
              window=None, num_sinks=0, chunk=None, seed=0, spare_blocks=3) -> Case:
    """`seqs`: [(seq_len, num_new)]. Shuffled block ids; NaN in block 0 and every unused slot."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(seq_len / block_size) for seq_len, _ in seqs]
    num_blocks = 1 + sum(blocks_per_seq) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, HEAD_DIM)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(seqs), max(blocks_per_seq) + 1, dtype=torch.int32)
    keys, values, queries, slots = [], [], [], []
    for s, (seq_len, num_new) in enumerate(seqs):
        k = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        first = first_needed_block(seq_len, num_new, block_size, window, chunk)
        sink_blocks = math.ceil(num_sinks / block_size) if window is not None else 0
        for b in range(blocks_per_seq[s]):
            table[s, b] = ids.pop() if b >= first or b < sink_blocks else NULL_BLOCK
        pos = torch.arange(seq_len)
        slot = table[s, pos // block_size].long() * block_size + pos % block_size
        live = table[s, pos // block_size] != NULL_BLOCK
        write_kv(k[live], v[live], k_cache, v_cache, slot[live])
        keys.append(k)
        values.append(v)
        queries.append(torch.randn(num_new, num_q_heads, HEAD_DIM, generator=gen).to(dtype))
        slots.append(slot[seq_len - num_new:])
    counts = torch.tensor([n for _, n in seqs])
    batch = AttentionBatch(
        query_start_loc=torch.cat([torch.zeros(1), counts.cumsum(0)]).to(torch.int32),
        seq_lens=torch.tensor([s for s, _ in seqs], dtype=torch.int32),
        block_table=table,
        slot_mapping=torch.cat(slots),
    )
    return Case(torch.cat(queries), k_cache, v_cache, batch, keys, values)


def dense_reference(case: Case, *, scale, window=None, num_sinks=0, chunk=None, softcap=None,
                    sinks=None) -> torch.Tensor:
    """Full K/V per sequence, an explicit boolean mask, softmax in float64."""
    outs = []
    starts = case.batch.query_start_loc.tolist()
    for s, seq_len in enumerate(case.batch.seq_lens.tolist()):
        q = case.query[starts[s]:starts[s + 1]].double()  # [n, Hq, D]
        n, num_q_heads, _ = q.shape
        if n == 0:
            continue
        group = num_q_heads // case.keys[s].shape[1]
        k = case.keys[s].double().repeat_interleave(group, dim=1)  # [seq_len, Hq, D]
        v = case.values[s].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [Hq, n, seq_len]
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        mask = torch.tensor([[is_visible(seq_len - n + i, j, window, num_sinks, chunk)
                              for j in range(seq_len)] for i in range(n)], dtype=torch.bool)
        scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is not None:
            sink_col = sinks.double()[:, None, None].expand(-1, n, 1)
            probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs).to(case.query.dtype)


def run(case: Case, **options) -> torch.Tensor:
    return paged_attention(case.query, case.k_cache, case.v_cache, case.batch, **options)


def check(case: Case, *, atol=1e-5, rtol=1e-5, **options) -> None:
    """paged_attention equals the dense reference for the same options."""
    options.setdefault("scale", HEAD_DIM**-0.5)
    out = run(case, **options)
    expected = dense_reference(
        case, scale=options["scale"], window=options.get("sliding_window"),
        num_sinks=options.get("num_sink_tokens", 0), chunk=options.get("chunk_size"),
        softcap=options.get("softcap"), sinks=options.get("sinks"),
    )
    assert out.shape == case.query.shape and out.dtype == case.query.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


MIXED = [(13, 13), (21, 8), (9, 1), (30, 1)]  # fresh prefill, continued prefill, two decodes


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_causal_mixed_batch_gqa(block_size):
    check(make_case(MIXED, block_size=block_size))


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (6, 2), (4, 1)])
def test_head_grouping(num_q_heads, num_kv_heads):
    case = make_case(MIXED, block_size=4, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads)
    check(case)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("window", [1, 5, 8, 100])
def test_sliding_window(block_size, window):
    case = make_case(MIXED + [(40, 3)], block_size=block_size, window=window)
    check(case, sliding_window=window)


@pytest.mark.parametrize("block_size,num_sinks", [(4, 4), (4, 3), (1, 2), (16, 5)])
def test_sliding_window_with_sink_tokens(block_size, num_sinks):
    case = make_case(MIXED + [(40, 3)], block_size=block_size, window=6, num_sinks=num_sinks)
    check(case, sliding_window=6, num_sink_tokens=num_sinks)


@pytest.mark.parametrize("block_size,chunk", [(4, 8), (1, 3), (16, 16), (4, 4)])
def test_chunked_local(block_size, chunk):
    case = make_case(MIXED + [(37, 11)], block_size=block_size, chunk=chunk)
    check(case, chunk_size=chunk)


def test_softcap_changes_result_and_matches():
    case = make_case(MIXED, block_size=4)
    case.query.mul_(6.0)  # large scores so the cap bites
    check(case, softcap=2.0)
    assert not torch.allclose(run(case, scale=HEAD_DIM**-0.5, softcap=2.0),
                              run(case, scale=HEAD_DIM**-0.5), atol=1e-3)


def test_sink_logits():
    case = make_case(MIXED, block_size=4)
    check(case, sinks=torch.linspace(-2.0, 3.0, 4))


def test_gpt_oss_style_window_sinks_softcap():
    case = make_case(MIXED + [(40, 3)], block_size=4, window=5)
    check(case, sliding_window=5, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]), softcap=3.0)


def test_null_block_and_unused_slots_hold_nan():
    case = make_case([(40, 2), (33, 9)], block_size=4, window=6)
    table = case.batch.block_table
    assert (table == NULL_BLOCK).any()
    assert torch.isnan(case.k_cache[NULL_BLOCK]).all()
    assert torch.isnan(case.v_cache[NULL_BLOCK]).all()
    unused = sorted(set(range(1, case.k_cache.shape[0])) - set(table.flatten().tolist()))
    assert unused and torch.isnan(case.k_cache[unused]).all()
    check(case, sliding_window=6)


def test_query_tiles_match_single_tile(monkeypatch):
    case = make_case([(50, 37), (20, 1)], block_size=4, window=7)
    expected = run(case, scale=0.3, sliding_window=7)
    monkeypatch.setattr(attention, "QUERY_TILE", 5)
    torch.testing.assert_close(run(case, scale=0.3, sliding_window=7), expected)
    check(case, scale=0.3, sliding_window=7)


@pytest.mark.parametrize("window,causal", [(None, True), (40, True), (5, False)])
def test_fresh_prompts_of_one_length_match_brute_force(window, causal, monkeypatch):
    # every tile starts its sequence: with no window cut the fused kernel runs in its causal
    # mode without a mask, the tiles' slots (whole blocks: 10) outnumbering their rows (8)
    calls = []
    sdpa = attention_batched.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("is_causal", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention_batched.F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(attention, "QUERY_TILE", 8)
    case = make_case([(8, 8), (8, 8), (8, 8)], block_size=5, window=window)
    check(case, scale=0.4, **({} if window is None else {"sliding_window": window}))
    assert calls and all(c == causal for c in calls)


def test_query_tile_follows_a_small_window():
    assert attention.query_tile(None, 16) == attention.QUERY_TILE
    assert attention.query_tile(attention.QUERY_TILE, 16) == attention.QUERY_TILE
    assert attention.query_tile(32, 16) == 32
    assert attention.query_tile(40, 16) == 48  # whole blocks
    assert attention.query_tile(3, 16) == 16  # at least a block


def test_sequence_without_new_tokens():
    check(make_case([(12, 0), (9, 9), (5, 0)], block_size=4))


@pytest.mark.parametrize("options", [{}, {"sliding_window": 6}, {"chunk_size": 8},
                                     {"sinks": torch.tensor([1.0, -1.0, 0.0, 2.0])}])
def test_bfloat16(options):
    case = make_case(MIXED + [(40, 3)], block_size=4, dtype=torch.bfloat16,
                     window=options.get("sliding_window"), chunk=options.get("chunk_size"))
    check(case, atol=2e-2, rtol=2e-2, **options)


def test_write_kv_round_trip():
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.zeros(6, 4, 2, HEAD_DIM)
    v_cache = torch.zeros(6, 4, 2, HEAD_DIM)
    slots = torch.randperm(24, generator=gen)[:10]
    key, value = torch.randn(2, 10, 2, HEAD_DIM, generator=gen)
    write_kv(key, value, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache.view(24, 2, HEAD_DIM)[slots], key, rtol=0, atol=0)
    torch.testing.assert_close(v_cache.view(24, 2, HEAD_DIM)[slots], value, rtol=0, atol=0)
    untouched = torch.ones(24, dtype=torch.bool)
    untouched[slots] = False
    assert (k_cache.view(24, -1)[untouched] == 0).all()


def test_write_kv_casts_to_cache_dtype():
    k_cache = torch.zeros(2, 2, 1, HEAD_DIM, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(1, 1, HEAD_DIM)
    write_kv(key, key, k_cache, v_cache, torch.tensor([3]))
    assert torch.equal(k_cache[1, 1], key[0].to(torch.bfloat16))


@pytest.mark.parametrize("key_shape,cache_shape,num_slots,match", [
    ((3, 2, 8), (4, 4, 2, 4), 3, "head_dim"),
    ((3, 1, 8), (4, 4, 2, 8), 3, "heads"),
    ((3, 2, 8), (4, 4, 2, 8), 2, "slot_mapping"),
])
def test_write_kv_rejects_bad_shapes(key_shape, cache_shape, num_slots, match):
    key = torch.zeros(key_shape)
    cache = torch.zeros(cache_shape)
    with pytest.raises(ValueError, match=match):
        write_kv(key, key, cache, cache.clone(), torch.arange(num_slots))


def _bad(case: Case, **changes):
    fields = {"query": case.query, "k_cache": case.k_cache, "v_cache": case.v_cache,
              "batch": case.batch}
    fields.update(changes)
    return fields


@pytest.mark.parametrize("mutate,match", [
    (lambda c: _bad(c, query=torch.zeros(23, 3, HEAD_DIM)), "not a multiple"),
    (lambda c: _bad(c, query=torch.zeros(23, 4, HEAD_DIM + 1)), "head_dim"),
    (lambda c: _bad(c, query=torch.zeros(23, 4 * HEAD_DIM)), "query must be"),
    (lambda c: _bad(c, v_cache=c.v_cache[:, :2]), "same"),
    (lambda c: _bad(c, query=c.query[:-1]), "num_tokens"),
    (lambda c: _bad(c, batch=AttentionBatch(c.batch.query_start_loc, c.batch.seq_lens - 4,
                                            c.batch.block_table, c.batch.slot_mapping)),
     "new tokens"),
    (lambda c: _bad(c, batch=AttentionBatch(c.batch.query_start_loc, c.batch.seq_lens,
                                            c.batch.block_table[:, :2], c.batch.slot_mapping)),
     "capacity"),
    (lambda c: _bad(c, batch=AttentionBatch(c.batch.query_start_loc[:-1], c.batch.seq_lens,
                                            c.batch.block_table, c.batch.slot_mapping)),
     "query_start_loc"),
])
def test_paged_attention_rejects_bad_shapes(mutate, match):
    case = make_case(MIXED, block_size=4)
    with pytest.raises(ValueError, match=match):
        paged_attention(**mutate(case), scale=1.0)


@pytest.mark.parametrize("options,match", [
    ({"sliding_window": 0}, "sliding_window"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"num_sink_tokens": -1}, "num_sink_tokens"),
    ({"chunk_size": 8, "num_sink_tokens": 2}, "num_sink_tokens"),
    ({"softcap": 0.0}, "softcap"),
    ({"sinks": torch.zeros(2)}, "sinks"),
])
def test_paged_attention_rejects_bad_options(options, match):
    case = make_case(MIXED, block_size=4)
    with pytest.raises(ValueError, match=match):
        run(case, scale=1.0, **options)


def test_flash_path_not_taken_on_cpu():
    query, cache = torch.zeros(1, 4, HEAD_DIM), torch.zeros(2, 256, 2, HEAD_DIM)
    assert not can_use_flash_attention(query, cache, num_sink_tokens=0, chunk_size=None,
                                       sinks=None)


# --- batched tiles: many decodes, shared prefix blocks, grouping -----------------------------

DECODES = [(n, 1) for n in (33, 40, 47, 48, 52, 61, 64, 70, 9)]
BATCH_OPTIONS = [
    {}, {"sliding_window": 5}, {"sliding_window": 6, "num_sink_tokens": 3}, {"chunk_size": 8},
    {"softcap": 2.0}, {"sinks": torch.tensor([0.5, -1.0, 2.0, 0.0])},
    {"sliding_window": 7, "softcap": 3.0, "sinks": torch.tensor([1.0, 0.0, -2.0, 0.5])},
]


def layout(options, **kwargs) -> dict:
    """make_case arguments nulling the blocks `options` never read."""
    return {"window": options.get("sliding_window"), "chunk": options.get("chunk_size"),
            "num_sinks": options.get("num_sink_tokens", 0), **kwargs}


def share_prefix(case: Case, num_blocks: int) -> Case:
    """Every sequence's first blocks become sequence 0's, as under prefix caching.

    The blocks they replace are left unused, holding NaN.
    """
    table, size = case.batch.block_table, num_blocks * case.k_cache.shape[1]
    for s in range(1, table.shape[0]):
        replaced = table[s, :num_blocks].long()
        assert (replaced != NULL_BLOCK).all() and (table[0, :num_blocks] != NULL_BLOCK).all()
        case.k_cache[replaced] = float("nan")
        case.v_cache[replaced] = float("nan")
        table[s, :num_blocks] = table[0, :num_blocks]
        case.keys[s][:size] = case.keys[0][:size]
        case.values[s][:size] = case.values[0][:size]
    return case


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("options", BATCH_OPTIONS)
def test_many_decodes_of_different_lengths(block_size, options):
    case = make_case(DECODES, block_size=block_size, **layout(options, seed=5))
    check(case, **options)


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(4, 1), (6, 2), (3, 3)])
def test_many_decodes_head_grouping(num_q_heads, num_kv_heads):
    case = make_case(DECODES, block_size=4, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads)
    check(case, sliding_window=9)
    check(case, sinks=torch.linspace(-1.0, 1.0, num_q_heads), softcap=2.5)


def test_decodes_over_whole_blocks_need_no_mask():
    case = make_case([(32, 1)] * 3 + [(16, 1)], block_size=4, seed=2)
    check(case)
    check(case, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]))


@pytest.mark.parametrize("options", [
    {}, {"softcap": 2.0}, {"sinks": torch.tensor([0.5, -1.0, 2.0, 0.0])}, {"chunk_size": 64},
    {"sliding_window": 100, "softcap": 3.0, "sinks": torch.tensor([1.0, 0.0, -2.0, 0.5])},
])
def test_shared_prefix_blocks_scored_once(monkeypatch, options):
    shared = []
    real = attention_batched._shared_prefix_blocks
    monkeypatch.setattr(attention_batched, "_shared_prefix_blocks",
                        lambda *args: shared.append(real(*args)) or shared[-1])
    for seqs in ([(40, 1), (45, 1), (52, 1), (41, 1)], [(60, 9), (40, 4), (48, 3)]):
        case = share_prefix(make_case(seqs, block_size=4, seed=7), num_blocks=8)
        check(case, **options)
    # without softcap or sinks, decode-only batches and prefills go to torch's SDPA instead;
    # a decode-only batch with them goes to the C kernel where it is built
    fused = "softcap" not in options and "sinks" not in options
    decode_in_c = decode_native._decode_attn is not None
    # each group the grouped path runs scored the 8 shared blocks once
    assert shared == ([] if fused else [8] if decode_in_c else [8, 8])


def test_shared_prefix_bfloat16():
    seqs = [(40, 1), (45, 1), (52, 1), (41, 1), (60, 9)]
    case = share_prefix(make_case(seqs, block_size=4, dtype=torch.bfloat16, seed=4), num_blocks=8)
    check(case, atol=2e-2, rtol=2e-2)
    check(case, atol=2e-2, rtol=2e-2, softcap=2.0, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]))


def test_prefill_head_groups_without_sdpa_gqa(monkeypatch):
    monkeypatch.setattr(attention_batched, "SDPA_HAS_GQA", False)  # torch < 2.5
    case = make_case(MIXED + [(40, 3)], block_size=4, num_q_heads=6, num_kv_heads=2, window=7)
    check(case, sliding_window=7)


@pytest.mark.parametrize("settings", [
    {"MAX_SCORE_ELEMENTS": 1},  # every tile alone
    {"PADDING_RATIO": 1e9, "PADDING_SLACK": 1 << 30},  # one group, query rows padded
])
@pytest.mark.parametrize("options", [{}, BATCH_OPTIONS[2], BATCH_OPTIONS[-1]])
def test_grouping_does_not_change_results(monkeypatch, settings, options):
    case = make_case(MIXED + DECODES[:4] + [(40, 3)], block_size=4, **layout(options, seed=9))
    for name, value in settings.items():
        monkeypatch.setattr(attention_batched, name, value)
    monkeypatch.setattr(attention, "QUERY_TILE", 6)
    check(case, **options)


@pytest.mark.parametrize("rules,expected", [
    (MaskRules(1.0), [Tile(0, 0, 4, 4, 0, 0, 8, 1), Tile(0, 4, 2, 8, 0, 0, 12, 2),
                      Tile(1, 6, 1, 19, 0, 0, 20, 4)]),
    (MaskRules(1.0, sliding_window=3, num_sink_tokens=2),
     [Tile(0, 0, 4, 4, 2, 2, 12, 0), Tile(0, 4, 2, 8, 6, 2, 12, 0),
      Tile(1, 6, 1, 19, 17, 2, 8, 0)]),
    (MaskRules(1.0, chunk_size=8), [Tile(0, 0, 4, 4, 0, 0, 8, 1), Tile(0, 4, 2, 8, 8, 0, 4, 0),
                                    Tile(1, 6, 1, 19, 16, 0, 4, 0)]),
])
def test_plan_tiles(rules, expected):
    assert plan_tiles([0, 6, 7], [10, 20], rules, tile_size=4, block_size=4) == expected


def test_group_tiles_bounds_padding_and_size():
    decodes = [Tile(s, s, 1, 2000 + s, 0, 0, 2016, 125) for s in range(32)]
    short = [Tile(32 + s, 32 + s, 1, 500, 0, 0, 512, 31) for s in range(32)]
    prefill = Tile(64, 64, 256, 1800, 0, 0, 2064, 0)
    groups = group_tiles(short + [prefill] + decodes, num_heads=4)
    # k short decodes join the long ones while (32 + k) * 2016 <= 1.25 * (32 * 2016 + 512 * k)
    # + 2**14, i.e. k <= 23; a 256-query tile never shares with single queries
    assert groups == [[prefill], decodes + short[:23], short[23:]]
    assert [len(g) for g in group_tiles(decodes, num_heads=1 << 10)] == [2] * 16


@pytest.mark.parametrize("options", [{}, {"sliding_window": 5}, {"chunk_size": 8}])
def test_decode_batches_take_one_fused_call(monkeypatch, options):
    calls = []
    real, from_table = attention.decode_attention, attention.decode_from_table
    monkeypatch.setattr(attention, "decode_attention",
                        lambda *args: calls.append("slots") or real(*args))

    def counted_from_table(*args):
        out = from_table(*args)
        if out is not None:
            calls.append("table")
        return out

    monkeypatch.setattr(attention, "decode_from_table", counted_from_table)
    check(make_case(DECODES, block_size=4, **layout(options, seed=3)), **options)
    assert len(calls) == 1  # the C kernel reading the block table, or one gather + SDPA
