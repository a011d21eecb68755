"""Spec validation, grouping, page-size unification and pool sizing."""

import pytest

from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)


@pytest.mark.parametrize("make, field", [
    (lambda: FullAttentionSpec(block_size=0), "block_size"),
    (lambda: FullAttentionSpec(block_size=2.5), "block_size"),
    (lambda: FullAttentionSpec(block_size=True), "block_size"),
    (lambda: FullAttentionSpec(16, num_kv_heads=0), "num_kv_heads"),
    (lambda: FullAttentionSpec(16, head_size=-1), "head_size"),
    (lambda: FullAttentionSpec(16, dtype="float64x"), "dtype"),
    (lambda: SlidingWindowSpec(16, sliding_window=0), "sliding_window"),
    (lambda: SlidingWindowSpec(16), "sliding_window"),
    (lambda: SlidingWindowSpec(16, sliding_window=8, num_sink_tokens=-1), "num_sink_tokens"),
    (lambda: ChunkedLocalAttentionSpec(16, attention_chunk_size=24), "attention_chunk_size"),
    (lambda: ChunkedLocalAttentionSpec(16, attention_chunk_size=0), "attention_chunk_size"),
    (lambda: SinkFullAttentionSpec(16, sink_len=8), "sink_len"),
    (lambda: SinkFullAttentionSpec(16, sink_len=0), "sink_len"),
    (lambda: MambaSpec(16, shapes=()), "shapes"),
    (lambda: MambaSpec(16, shapes=((4, 0),)), "shapes"),
    (lambda: MambaSpec(16, checkpoint_interval=0), "checkpoint_interval"),
    (lambda: MambaSpec(16, shapes=((4, 4),), page_size_padded=8), "page_size_padded"),
])
def test_invalid_spec_fields_raise_value_error_naming_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_page_sizes_from_first_principles():
    # K and V, 16 tokens, 2 heads of 8, float16 -> 2 * 16 * 2 * 8 * 2 bytes
    assert FullAttentionSpec(16, num_kv_heads=2, head_size=8).page_size_bytes == 1024
    assert SlidingWindowSpec(4, num_kv_heads=1, head_size=4, dtype="float32",
                             sliding_window=3).page_size_bytes == 128
    assert MambaSpec(16, shapes=((3, 4), (4, 8)), dtype="float32").page_size_bytes == 4 * (12 + 32)


def test_window_and_sink_block_counts():
    spec = SlidingWindowSpec(4, sliding_window=9, num_sink_tokens=5)
    assert spec.num_window_blocks == 2  # ceil(8 / 4)
    assert spec.num_sink_blocks == 2  # ceil(5 / 4)
    assert SlidingWindowSpec(4, sliding_window=1).num_window_blocks == 0


def test_specs_are_frozen():
    spec = FullAttentionSpec(16)
    with pytest.raises(AttributeError):
        spec.block_size = 8


def test_config_validation():
    group = KVCacheGroupSpec(["a"], FullAttentionSpec(16))
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheConfig(1, [group])
    with pytest.raises(ValueError, match="kv_cache_groups"):
        KVCacheConfig(8, [])
    with pytest.raises(ValueError, match="kv_cache_spec"):
        KVCacheGroupSpec(["a"], "full")


def test_from_layer_specs_groups_equal_specs_and_shares_tensors():
    full = FullAttentionSpec(16, num_kv_heads=2, head_size=8)
    swa = SlidingWindowSpec(16, num_kv_heads=2, head_size=8, sliding_window=64)
    layers = {"l0": swa, "l1": swa, "l2": full, "l3": swa, "l4": swa, "l5": full}
    page = full.page_size_bytes
    cfg = KVCacheConfig.from_layer_specs(layers, 2 * page * 100 + 5)
    # four sliding layers split into two groups of two: no group is padded
    assert [g.layer_names for g in cfg.kv_cache_groups] == [["l0", "l1"], ["l3", "l4"],
                                                             ["l2", "l5"]]
    assert cfg.num_tensors == 2 and cfg.page_size_bytes == page
    assert cfg.num_blocks == 100
    assert cfg.padding_bytes_per_block == (0, 0, 0)
    assert cfg.layer_to_tensor["l2"] == 0 and cfg.layer_to_tensor["l5"] == 1
    assert cfg.layer_to_tensor["l4"] == 1


def test_uneven_layer_counts_are_split_with_little_padding():
    full = FullAttentionSpec(16, num_kv_heads=2, head_size=8)
    swa = SlidingWindowSpec(16, num_kv_heads=2, head_size=8, sliding_window=64)
    layers = {f"s{i}": swa for i in range(52)} | {f"f{i}": full for i in range(10)}
    cfg = KVCacheConfig.from_layer_specs(layers, 1 << 30)
    sizes = [len(g.layer_names) for g in cfg.kv_cache_groups]
    assert sorted(sizes[:6]) == [8, 8, 9, 9, 9, 9] and sizes[6] == 10 and cfg.num_tensors == 10
    names = [n for g in cfg.kv_cache_groups for n in g.layer_names]
    assert sorted(names) == sorted(layers)  # every layer in exactly one group
    page = full.page_size_bytes
    assert cfg.padding_bytes_per_block == tuple(page * (10 - n) for n in sizes)


def test_attention_block_sizes_scale_to_one_page():
    small = FullAttentionSpec(16, num_kv_heads=1, head_size=8)  # 512 B
    big = SlidingWindowSpec(16, num_kv_heads=4, head_size=8, sliding_window=128)  # 2048 B
    cfg = KVCacheConfig.from_layer_specs({"a": small, "b": big}, 10 * 2048)
    specs = {g.layer_names[0]: g.kv_cache_spec for g in cfg.kv_cache_groups}
    assert specs["a"].block_size == 64 and specs["b"].block_size == 16
    assert cfg.page_size_bytes == 2048 and cfg.num_blocks == 10


def test_mamba_pages_padded_or_attention_scaled_up():
    attn = FullAttentionSpec(16, num_kv_heads=1, head_size=8, dtype="float32")  # 1024 B
    mamba = MambaSpec(16, shapes=((10, 10),), dtype="float32")  # 400 B
    cfg = KVCacheConfig.from_layer_specs({"a": attn, "m": mamba}, 1024 * 8)
    specs = {g.layer_names[0]: g.kv_cache_spec for g in cfg.kv_cache_groups}
    assert specs["m"].page_size_bytes == 1024 and specs["a"].block_size == 16
    assert cfg.padding_bytes_per_block == (0, 624)
    big_state = MambaSpec(16, shapes=((30, 30),), dtype="float32")  # 3600 B -> 4 x 1024
    cfg = KVCacheConfig.from_layer_specs({"a": attn, "m": big_state}, 4096 * 8)
    specs = {g.layer_names[0]: g.kv_cache_spec for g in cfg.kv_cache_groups}
    assert specs["a"].block_size == 64 and specs["m"].page_size_bytes == 4096


def test_unifiable_pages_raise_saying_what_to_change():
    a = FullAttentionSpec(16, num_kv_heads=3, head_size=8)  # 96 B per token
    b = FullAttentionSpec(16, num_kv_heads=5, head_size=8)  # 2560 B pages: 26.7 tokens of a
    with pytest.raises(ValueError, match="cannot unify page sizes"):
        KVCacheConfig.from_layer_specs({"a": a, "b": b}, 1 << 20)


def test_scaled_block_that_breaks_a_chunk_is_reported():
    a = FullAttentionSpec(16, num_kv_heads=4, head_size=8)
    b = ChunkedLocalAttentionSpec(16, num_kv_heads=1, head_size=8, attention_chunk_size=16)
    with pytest.raises(ValueError, match="attention_chunk_size"):
        KVCacheConfig.from_layer_specs({"a": a, "b": b}, 1 << 20)


@pytest.mark.parametrize("budget", [0, -1, 10, 1.5])
def test_too_small_or_invalid_budget(budget):
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        KVCacheConfig.from_layer_specs({"a": FullAttentionSpec(16)}, budget)


def test_empty_or_bad_layer_specs():
    with pytest.raises(ValueError, match="layer_specs"):
        KVCacheConfig.from_layer_specs({}, 1 << 20)
    with pytest.raises(ValueError, match="layer_specs"):
        KVCacheConfig.from_layer_specs({"a": 16}, 1 << 20)
