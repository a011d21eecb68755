"""Token rows of paged caches: the row view reads and writes what two-index addressing does."""

import pytest
import torch

from hybridkv.kernels.paged_rows import gather_slots, row_view, scatter_slots, slots_to_rows


def paged_k_v(num_blocks=5, block_size=4, heads=2, dim=3, pad=0):
    """K and V views sharing pages (K, V adjacent, `pad` extra elements per page)."""
    page = 2 * block_size * heads * dim + pad
    raw = torch.arange(num_blocks * page, dtype=torch.float32)
    pages = raw.view(num_blocks, page)[:, :page - pad] if pad else raw.view(num_blocks, page)
    kv = pages.reshape(num_blocks, 2, block_size, heads, dim) if not pad else \
        pages.view(num_blocks, -1).unflatten(1, (2, block_size, heads, dim))
    return kv[:, 0], kv[:, 1]


def test_worked_example_rows():
    assert slots_to_rows(torch.tensor([0, 1, 2, 5]), 2, 4).tolist() == [0, 1, 4, 9]


@pytest.mark.parametrize("pad", [0, 6, 5])
def test_gather_matches_two_index_addressing(pad):
    k, v = paged_k_v(pad=pad)
    slots = torch.tensor([19, 0, 3, 4, 13, 13, 7])
    expected = [cache[slots // 4, slots % 4] for cache in (k, v)]
    for cache, want in zip((k, v), expected):
        assert torch.equal(gather_slots(slots, cache)[0], want)
    got_k, got_v = gather_slots(slots, k, v)  # both in one call (one row index)
    assert torch.equal(got_k, expected[0]) and torch.equal(got_v, expected[1])
    # a page that is not a whole number of token rows has no row view
    assert (row_view(k) is None) == (pad == 5)


@pytest.mark.parametrize("pad", [0, 6, 5])
def test_scatter_writes_only_its_slots(pad):
    k, v = paged_k_v(pad=pad)
    before_v = v.clone()
    expected = k.clone()
    slots = torch.tensor([18, 2, 9])
    values = -torch.rand(3, 2, 3)
    expected[slots // 4, slots % 4] = values
    scatter_slots(slots, (k, values))
    assert torch.equal(k, expected)
    assert torch.equal(v, before_v)  # V, in the same pages, untouched


@pytest.mark.parametrize("pad", [0, 6, 5])
def test_scatter_of_k_and_v_in_one_call(pad):
    k, v = paged_k_v(pad=pad)
    slots = torch.tensor([18, 2, 9])
    k_values, v_values = -torch.rand(3, 2, 3), torch.rand(3, 2, 3) + 1000
    expected_k, expected_v = k.clone(), v.clone()
    expected_k[slots // 4, slots % 4] = k_values
    expected_v[slots // 4, slots % 4] = v_values
    scatter_slots(slots, (k, k_values), (v, v_values))
    assert torch.equal(k, expected_k) and torch.equal(v, expected_v)


def test_slot_past_the_cache_raises():
    k, _ = paged_k_v()
    with pytest.raises(IndexError):
        gather_slots(torch.tensor([5 * 4]), k)
