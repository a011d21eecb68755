"""KV cache groups and the shared pool's layout.

Layers with equal specs form a group; every group draws block ids from one
pool. Tensor i of the pool is shared by the i-th layer of every group (each
group padded to the same layer count), so one block id addresses one page in
each tensor, and every spec is made to have the same page size: attention
block sizes are scaled up, Mamba pages padded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hybridkv.kv_cache.checks import check_int
from hybridkv.kv_cache.specs import AttentionSpec, KVCacheSpec, MambaSpec

MAX_NUM_BLOCKS = 2**31 - 1  # block ids travel as int32 in block tables


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers sharing one spec, and so one block table per request."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec

    def __post_init__(self) -> None:
        if not isinstance(self.kv_cache_spec, KVCacheSpec):
            raise ValueError(f"KVCacheGroupSpec.kv_cache_spec must be a KVCacheSpec, "
                             f"got {type(self.kv_cache_spec).__name__}")
        if not isinstance(self.layer_names, list | tuple) or not all(
                isinstance(n, str) for n in self.layer_names):
            raise ValueError(f"KVCacheGroupSpec.layer_names must be a list of str, "
                             f"got {self.layer_names!r}")


@dataclass(frozen=True)
class KVCacheConfig:
    """The pool size and its groups.

    `page_size_bytes`, `num_tensors` and `padding_bytes` are filled in by
    `from_layer_specs` (memory layout); plain bookkeeping use needs none.
    """

    num_blocks: int
    kv_cache_groups: list[KVCacheGroupSpec]
    page_size_bytes: int = 0
    num_tensors: int = 0
    # per group: bytes of a block of that group no layer uses (padded pages and slots)
    padding_bytes_per_block: tuple[int, ...] = ()
    layer_to_tensor: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_int("KVCacheConfig.num_blocks", self.num_blocks, 2, MAX_NUM_BLOCKS,
                  " (the null block plus one; block tables hold int32 ids)")
        if not self.kv_cache_groups:
            raise ValueError("KVCacheConfig.kv_cache_groups must not be empty")
        for group in self.kv_cache_groups:
            if not isinstance(group, KVCacheGroupSpec):
                raise ValueError(f"KVCacheConfig.kv_cache_groups must hold KVCacheGroupSpec, "
                                 f"got {type(group).__name__}")

    @property
    def specs(self) -> list[KVCacheSpec]:
        return [g.kv_cache_spec for g in self.kv_cache_groups]

    @property
    def total_bytes(self) -> int:
        """Bytes of all tensors (0 when the layout was not computed)."""
        return self.num_blocks * self.page_size_bytes * self.num_tensors

    def describe(self) -> str:
        """A few lines on groups, page size, block count and padding waste."""
        lines = [f"{self.num_blocks} blocks x {self.num_tensors} tensors x "
                 f"{self.page_size_bytes} B pages"]
        for i, g in enumerate(self.kv_cache_groups):
            lines.append(f"  group {i}: {type(g.kv_cache_spec).__name__} "
                         f"block_size={g.kv_cache_spec.block_size} layers={len(g.layer_names)}")
        if any(self.padding_bytes_per_block):
            waste = sum(self.padding_bytes_per_block) / (
                len(self.kv_cache_groups) * self.page_size_bytes * self.num_tensors)
            lines.append(f"  padding: {list(self.padding_bytes_per_block)} B per block of each "
                         f"group ({waste:.1%} of the pool if groups hold equal block counts)")
        return "\n".join(lines)

    @classmethod
    def from_layer_specs(cls, layer_specs: Mapping[str, KVCacheSpec],
                         kv_cache_memory_bytes: int) -> KVCacheConfig:
        """Group layers by spec and size one shared pool from a memory budget.

        Layers with equal specs form groups of at most `group_size` layers
        (chosen so that padding groups to one layer count wastes little);
        every group is padded to `num_tensors` layers. Raises ValueError when
        the specs' pages cannot be unified or the budget buys fewer than two
        blocks.
        """
        _check_layer_specs(layer_specs, kv_cache_memory_bytes)
        grouped = split_groups(_group_layers(layer_specs))
        specs, page = unify_page_sizes([spec for spec, _ in grouped])
        num_tensors = max(len(names) for _, names in grouped)
        num_blocks = kv_cache_memory_bytes // (page * num_tensors)
        if num_blocks < 2:
            raise ValueError(
                f"kv_cache_memory_bytes={kv_cache_memory_bytes} buys {num_blocks} blocks of "
                f"{page * num_tensors} bytes; at least 2 are needed (raise the budget)")
        groups = [KVCacheGroupSpec(list(names), spec) for spec, (_, names) in zip(specs, grouped)]
        padding = tuple(page * (num_tensors - len(g.layer_names))
                        + (page - _natural_page(g.kv_cache_spec)) * len(g.layer_names)
                        for g in groups)
        layer_to_tensor = {n: i for g in groups for i, n in enumerate(g.layer_names)}
        return cls(num_blocks, groups, page, num_tensors, padding, layer_to_tensor)


def _check_layer_specs(layer_specs: Mapping[str, KVCacheSpec], budget: int) -> None:
    if not layer_specs:
        raise ValueError("layer_specs must not be empty")
    for name, spec in layer_specs.items():
        if not isinstance(spec, KVCacheSpec):
            raise ValueError(f"layer_specs[{name!r}] must be a KVCacheSpec, got {spec!r}")
    check_int("kv_cache_memory_bytes", budget, 1)


def _group_layers(layer_specs: Mapping[str, KVCacheSpec]) -> list[tuple[KVCacheSpec, list[str]]]:
    """Equal specs form one group, in order of first appearance."""
    groups: dict[KVCacheSpec, list[str]] = {}
    for name, spec in layer_specs.items():
        groups.setdefault(spec, []).append(name)
    return list(groups.items())


MAX_SLOT_WASTE = 0.15


def split_groups(grouped: list[tuple[KVCacheSpec, list[str]]]
                 ) -> list[tuple[KVCacheSpec, list[str]]]:
    """Split each spec's layers into groups of similar size so that padding
    every group to the largest one wastes at most MAX_SLOT_WASTE of the slots.

    The largest group size that does is used (fewer groups, less bookkeeping):
    52 sliding + 10 full layers -> six sliding groups of 8-9 and one of 10
    (11% of slots padded) rather than 52 + 10 (81% of a full block padded).
    """
    counts = [len(names) for _, names in grouped]
    for size in range(min(counts), 0, -1):
        parts = [-(-c // size) for c in counts]
        width = max(-(-c // k) for c, k in zip(counts, parts))
        if 1 - sum(counts) / (width * sum(parts)) <= MAX_SLOT_WASTE:
            break
    out = []
    for (spec, names), k in zip(grouped, parts):
        bounds = [round(i * len(names) / k) for i in range(k + 1)]
        out += [(spec, names[a:b]) for a, b in zip(bounds, bounds[1:])]
    return out


def _natural_page(spec: KVCacheSpec) -> int:
    return spec.state_bytes if isinstance(spec, MambaSpec) else spec.page_size_bytes


def unify_page_sizes(specs: list[KVCacheSpec]) -> tuple[list[KVCacheSpec], int]:
    """Scale attention block sizes and pad Mamba pages to one page size.

    Every attention spec's block size is raised so its page equals the
    largest attention page (times the factor a Mamba state needs); Mamba
    pages are padded to it. Returns the new specs and the page size.
    """
    attn = [s for s in specs if isinstance(s, AttentionSpec)]
    state = max((s.state_bytes for s in specs if isinstance(s, MambaSpec)), default=0)
    if not attn:
        return [_pad(s, state) for s in specs], state
    page = max(s.page_size_bytes for s in attn)
    page *= max(1, math.ceil(state / page))
    return [_fit_page(s, page) for s in specs], page


def _pad(spec: KVCacheSpec, page: int) -> KVCacheSpec:
    assert isinstance(spec, MambaSpec)
    return MambaSpec(spec.block_size, shapes=spec.shapes, dtype=spec.dtype,
                     page_size_padded=page, checkpoint_interval=spec.checkpoint_interval)


def _fit_page(spec: KVCacheSpec, page: int) -> KVCacheSpec:
    if isinstance(spec, MambaSpec):
        return _pad(spec, page)
    per_token = spec.page_size_bytes // spec.block_size
    if page % per_token:
        raise ValueError(
            f"cannot unify page sizes: a {page}-byte page is not a whole number of "
            f"{per_token}-byte tokens of {spec}; change block_size, num_kv_heads or head_size "
            f"so per-token sizes divide each other")
    block_size = page // per_token
    if block_size == spec.block_size:
        return spec
    try:
        return spec.with_block_size(block_size)
    except ValueError as e:
        raise ValueError(f"cannot unify page sizes: {spec} would need block_size="
                         f"{block_size}: {e}") from e
