"""The C decode kernel: one query per sequence, K and V read in place from paged caches,
checked against a float64 softmax over the same rows read by two-index addressing."""

import types

import pytest
import torch

from hybridkv.kernels import decode_native
from hybridkv.kernels.attention import MaskRules
from hybridkv.kernels.attention_decode import decode_attention, decode_layout
from tests.kernels.test_attention_decode import decode_batch

pytestmark = pytest.mark.skipif(decode_native._decode_attn is None,
                                reason="the C decode kernel is not built")


def paged_caches(num_blocks, block_size, heads, dim, pad, seed):
    """K and V sharing pages (K then V, `pad` floats after them), unused blocks NaN."""
    page = 2 * block_size * heads * dim + pad
    raw = torch.randn(num_blocks, page, generator=torch.Generator().manual_seed(seed))
    kv = raw[:, :page - pad].unflatten(1, (2, block_size, heads, dim))
    return kv[:, 0], kv[:, 1]


def expected(query, k, v, slots, counts, num_keys, scale, softcap=None, sinks=None):
    """float64 attention of sequence s over its first counts[s] slots (scores capped to
    `softcap * tanh(score / softcap)` when `softcap` is given; head h's sink logit
    `sinks[h]` a key without a value, when `sinks` is given)."""
    out = torch.empty(query.shape, dtype=torch.float64)
    group = query.shape[1] // k.shape[2]
    block_size = k.shape[1]
    for s, n in enumerate(counts.tolist()):
        mine = slots[s * num_keys:s * num_keys + n]
        keys = k[mine // block_size, mine % block_size].double()  # [n, Hkv, D]
        values = v[mine // block_size, mine % block_size].double()
        for h in range(query.shape[1]):
            scores = keys[:, h // group] @ query[s, h].double() * scale  # [n]
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            if sinks is not None:  # softmax over the keys and the sink; the sink adds no value
                weights = torch.softmax(torch.cat([scores, sinks[h:h + 1].double()]), 0)[:-1]
            else:
                weights = torch.softmax(scores, 0)
            out[s, h] = weights @ values[:, h // group]
    return out


@pytest.mark.parametrize("num_q_heads,num_kv_heads,dim", [
    (4, 1, 256), (6, 2, 32), (3, 3, 16), (5, 1, 40), (8, 2, 20)])
@pytest.mark.parametrize("pad", [0, 12])
def test_matches_a_float64_softmax_over_the_same_rows(num_q_heads, num_kv_heads, dim, pad):
    block_size, num_blocks, num_keys = 4, 12, 9
    k, v = paged_caches(num_blocks, block_size, num_kv_heads, dim, pad * dim, seed=dim + pad)
    g = torch.Generator().manual_seed(num_q_heads)
    counts = torch.tensor([9, 1, 5])
    used = torch.randperm(num_blocks - 1, generator=g)[:3 * 3] + 1  # blocks 1.., 3 each
    slots = torch.cat([
        (used[3 * s:3 * s + 3, None] * block_size + torch.arange(block_size)).flatten()[:num_keys]
        for s in range(3)])
    for s, n in enumerate(counts.tolist()):  # padding repeats the sequence's last slot
        slots[s * num_keys + n:(s + 1) * num_keys] = slots[s * num_keys + n - 1]
    unused = torch.ones(num_blocks, dtype=torch.bool)
    unused[slots // block_size] = False
    k[unused] = float("nan")
    v[unused] = float("nan")
    query = torch.randn(3, num_q_heads, dim, generator=g)
    out = decode_native.native_decode_attention(query, k, v, slots, counts, num_keys, 0.3)
    assert out is not None and out.dtype == torch.float32
    want = expected(query, k, v, slots, counts, num_keys, 0.3)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_caches_without_a_row_view_are_left_to_torch():
    k, v = paged_caches(5, 4, 2, 3, 5, seed=0)  # page padding not a whole number of rows
    out = decode_native.native_decode_attention(torch.randn(1, 2, 3), k, v,
                                                torch.arange(4), torch.tensor([4]), 4, 1.0)
    assert out is None


def test_only_float32_cpu_layers_qualify():
    k, v = paged_caches(5, 4, 2, 8, 0, seed=0)
    query = torch.randn(2, 4, 8)
    assert decode_native.can_decode_natively(query, k, v)
    assert not decode_native.can_decode_natively(query.bfloat16(), k, v)
    assert not decode_native.can_decode_natively(query, k.double(), v)
    assert not decode_native.can_decode_natively(torch.randn(2, 3, 8), k, v)  # 3 heads on 2


def test_the_decode_path_runs_the_kernel_and_agrees_with_torch(monkeypatch):
    k, v = paged_caches(10, 2, 1, 32, 0, seed=3)
    batch = decode_batch([3, 6], [[5, 7, 0], [2, 9, 4]])
    layout = decode_layout(batch, MaskRules(1.0, sliding_window=4), block_size=2)
    query = torch.randn(2, 4, 32)
    real = decode_native._decode_attn
    calls = []
    monkeypatch.setattr(decode_native, "_decode_attn", types.SimpleNamespace(
        decode=lambda *args: calls.append(args) or real.decode(*args)))
    fast = decode_attention(query, k, v, layout, 0.5)
    assert len(calls) == 1
    monkeypatch.setattr(decode_native, "can_decode_natively", lambda *args: False)
    monkeypatch.setattr("hybridkv.kernels.attention_decode.can_decode_natively",
                        lambda *args: False)
    torch.testing.assert_close(fast, decode_attention(query, k, v, layout, 0.5),
                               atol=1e-5, rtol=1e-5)
    assert len(calls) == 1  # the second run took the gather and SDPA


def test_the_version_names_the_decode_path():
    from hybridkv.tools.cli import version_text

    assert "decode attention: C kernel" in version_text()


@pytest.mark.parametrize("slot,count,error", [
    (48, 2, "outside the cache"), (-1, 2, "outside the cache"), (0, 0, "key counts"),
    (0, 3, "key counts")])
def test_bad_slots_or_counts_raise_before_the_kernel_reads(slot, count, error):
    k, v = paged_caches(12, 4, 1, 16, 0, seed=0)  # 48 rows
    slots = torch.tensor([1, slot])
    with pytest.raises(ValueError, match=error):
        decode_native.native_decode_attention(torch.randn(1, 2, 16), k, v, slots,
                                              torch.tensor([count]), 2, 0.3)


@pytest.mark.parametrize("rules", [MaskRules(0.4), MaskRules(0.4, sliding_window=5),
                                   MaskRules(0.4, chunk_size=8), MaskRules(0.4, softcap=1.5),
                                   MaskRules(0.4, sliding_window=5, softcap=3.0)])
@pytest.mark.parametrize("pad", [0, 12])
@pytest.mark.parametrize("sinks", [None, torch.tensor([0.5, -1.0, 4.0, 0.0])])
def test_reading_the_block_table_matches_a_float64_softmax(rules, pad, sinks):
    """The kernel finds each key's row from the block table; the oracle lists the keys a
    query sees by brute force (`MaskRules.allows`) and scores them in float64."""
    block_size, num_blocks, dim = 4, 16, 32
    k, v = paged_caches(num_blocks, block_size, 2, dim, pad * dim, seed=pad)
    table = [[3, 9, 1, 14, 0], [7, 2, 0, 0, 0], [5, 11, 6, 8, 12]]
    seq_lens = [15, 6, 19]
    used = {b for row in table for b in row} - {0}
    unused = torch.tensor([b not in used for b in range(num_blocks)])
    k[unused] = float("nan")
    v[unused] = float("nan")
    query = torch.randn(3, 4, dim, generator=torch.Generator().manual_seed(5))
    batch = decode_batch(seq_lens, table, plans={})
    out = decode_native.decode_from_table(query, k, v, batch, rules.sliding_window,
                                          rules.chunk_size, rules.scale, rules.softcap, sinks)
    assert out is not None
    num_keys = max(seq_lens)
    slots, counts = [], []
    for s, n in enumerate(seq_lens):
        seen = [p for p in range(n) if rules.allows(torch.tensor(n - 1), torch.tensor(p))]
        mine = [table[s][p // block_size] * block_size + p % block_size for p in seen]
        slots += mine + [mine[-1]] * (num_keys - len(mine))
        counts.append(len(mine))
    want = expected(query, k, v, torch.tensor(slots), torch.tensor(counts), num_keys,
                    rules.scale, rules.softcap, sinks)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seq_lens,table,error", [
    ([9], [[1, 2]], "capacity"), ([0], [[1, 2]], "capacity"), ([3], [[12, 2]], "block id"),
    ([3], [[-1, 2]], "block id")])
def test_bad_lengths_or_block_ids_raise_before_the_kernel_reads(seq_lens, table, error):
    k, v = paged_caches(12, 4, 1, 16, 0, seed=0)
    with pytest.raises(ValueError, match=error):
        decode_native.decode_from_table(torch.randn(1, 2, 16), k, v,
                                        decode_batch(seq_lens, table), None, None, 0.3)


@pytest.mark.parametrize("by_table", [False, True])
def test_sequences_split_over_threads_give_the_same_bits(by_table):
    """A call with more K floats than `MIN_PARALLEL_FLOATS` is split over torch's threads;
    each sequence is computed by one thread in one order, so every thread count gives the
    same bits, and the float64 oracle agrees."""
    block_size, heads, dim = 16, 2, 64
    seq_lens = [700, 3, 512, 900, 40]
    assert sum(seq_lens) * heads * dim >= decode_native._decode_attn.MIN_PARALLEL_FLOATS
    widths = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(widths) + 1
    k, v = paged_caches(num_blocks, block_size, heads, dim, 0, seed=3)
    order = (torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(4)) + 1)
    table, start = [], 0
    for w in widths:
        table.append(order[start:start + w].tolist() + [0] * (max(widths) - w))
        start += w
    query = torch.randn(len(seq_lens), 8, dim, generator=torch.Generator().manual_seed(6))
    num_keys = max(seq_lens)
    slots = torch.tensor([table[s][p // block_size] * block_size + p % block_size
                          for s, n in enumerate(seq_lens)
                          for p in list(range(n)) + [n - 1] * (num_keys - n)])
    counts = torch.tensor(seq_lens)

    def run(threads):
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            if by_table:
                return decode_native.decode_from_table(
                    query, k, v, decode_batch(seq_lens, table, plans={}), None, None, 0.2)
            return decode_native.native_decode_attention(query, k, v, slots, counts,
                                                         num_keys, 0.2)
        finally:
            torch.set_num_threads(previous)

    one = run(1)
    assert torch.equal(run(2), one) and torch.equal(run(3), one)
    want = expected(query, k, v, slots, counts, num_keys, 0.2)
    torch.testing.assert_close(one.double(), want, atol=1e-5, rtol=1e-5)
