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
    for cache in (k, v):
        expected = cache[slots // 4, slots % 4]
        assert torch.equal(gather_slots(cache, slots), expected)
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
    scatter_slots(k, slots, values)
    assert torch.equal(k, expected)
    assert torch.equal(v, before_v)  # V, in the same pages, untouched


def test_slot_past_the_cache_raises():
    k, _ = paged_k_v()
    with pytest.raises(IndexError):
        gather_slots(k, torch.tensor([5 * 4]))
