"""The decode path of the torch paged attention: which slots it reads, checked by hand."""

import torch

from hybridkv.kernels.attention import AttentionBatch, MaskRules
from hybridkv.kernels.attention_decode import decode_layout, is_decode_batch


def decode_batch(seq_lens, table, plans=None) -> AttentionBatch:
    return AttentionBatch(query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32),
                          seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                          block_table=torch.tensor(table, dtype=torch.int32),
                          slot_mapping=torch.zeros(len(seq_lens), dtype=torch.long),
                          max_query_len=1, plans=plans)


def test_window_layout_of_the_worked_example():
    batch = decode_batch([3, 6], [[5, 7, 0], [2, 9, 4]])
    layout = decode_layout(batch, MaskRules(1.0, sliding_window=4), block_size=2)
    assert layout.num_keys == 4
    # sequence 0: positions 0..2 in blocks 5, 5, 7, padded with its newest slot
    assert layout.slots.tolist() == [10, 11, 14, 14, 18, 19, 8, 9]
    assert layout.mask.flatten(1).tolist() == [[True, True, True, False], [True] * 4]


def test_chunk_and_full_layouts_by_brute_force():
    table = [[3, 1, 6, 2], [4, 7, 5, 8]]
    for rules in (MaskRules(1.0), MaskRules(1.0, chunk_size=4), MaskRules(1.0, sliding_window=3)):
        layout = decode_layout(decode_batch([7, 5], table), rules, block_size=2)
        for s, seq_len in enumerate([7, 5]):
            p = seq_len - 1
            seen = [k for k in range(seq_len) if rules.allows(torch.tensor(p), torch.tensor(k))]
            expected = [table[s][k // 2] * 2 + k % 2 for k in seen]
            row = layout.slots.view(2, -1)[s].tolist()
            valid = [True] * layout.num_keys if layout.mask is None \
                else layout.mask[s].flatten().tolist()
            assert [slot for slot, v in zip(row, valid) if v] == expected
            assert all(slot == expected[-1] for slot, v in zip(row, valid) if not v)


def test_layout_is_built_once_per_group_and_step():
    plans: dict = {}
    batch = decode_batch([3, 6], [[5, 7, 0], [2, 9, 4]], plans)
    rules = MaskRules(1.0, sliding_window=4)
    assert decode_layout(batch, rules, 2) is decode_layout(batch, rules, 2)
    other = decode_batch([3, 6], [[1, 3, 0], [2, 9, 4]], plans)  # another group, same step
    assert decode_layout(other, rules, 2).slots[0] == 2


def test_only_plain_one_token_batches_take_the_decode_path():
    batch = decode_batch([3, 6], [[5, 7, 0], [2, 9, 4]])
    query = torch.zeros(2, 4, 8)
    assert is_decode_batch(query, batch, MaskRules(1.0, sliding_window=4), None)
    assert not is_decode_batch(query, batch, MaskRules(1.0, softcap=5.0), None)
    assert not is_decode_batch(query, batch, MaskRules(1.0), torch.zeros(4))
    assert not is_decode_batch(query, batch, MaskRules(1.0, sliding_window=4,
                                                       num_sink_tokens=1), None)
    prefill = decode_batch([3, 6], [[5, 7, 0], [2, 9, 4]])
    prefill.query_start_loc = torch.tensor([0, 1, 3], dtype=torch.int32)
    prefill.max_query_len = None
    assert not is_decode_batch(torch.zeros(3, 4, 8), prefill, MaskRules(1.0), None)
