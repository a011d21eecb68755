"""Per-type managers, the retention and protection components they compose, and the
registry from spec class to manager class."""

from __future__ import annotations

from hybridkv.kv_cache.managers.base import SingleTypeManager
from hybridkv.kv_cache.managers.chunked_local import ChunkedLocalAttentionManager
from hybridkv.kv_cache.managers.full import FullAttentionManager
from hybridkv.kv_cache.managers.mamba import MambaManager, MambaStatePlan, mamba_state_plan
from hybridkv.kv_cache.managers.protection import Protection
from hybridkv.kv_cache.managers.retention import Retention
from hybridkv.kv_cache.managers.sink_full import SinkFullAttentionManager
from hybridkv.kv_cache.managers.sliding_window import SlidingWindowManager
from hybridkv.kv_cache.specs import KVCacheSpec

SPEC_TO_MANAGER: dict[type[KVCacheSpec], type[SingleTypeManager]] = {
    m.spec_class: m
    for m in (FullAttentionManager, SlidingWindowManager, ChunkedLocalAttentionManager,
              MambaManager, SinkFullAttentionManager)
}


def register_manager(spec_class: type[KVCacheSpec],
                     manager_class: type[SingleTypeManager]) -> None:
    """Use `manager_class` for groups whose spec is a `spec_class`."""
    if not (isinstance(spec_class, type) and issubclass(spec_class, KVCacheSpec)):
        raise ValueError(f"spec_class must subclass KVCacheSpec, got {spec_class!r}")
    if not (isinstance(manager_class, type) and issubclass(manager_class, SingleTypeManager)):
        raise ValueError(f"manager_class must subclass SingleTypeManager, got {manager_class!r}")
    SPEC_TO_MANAGER[spec_class] = manager_class


def manager_class_for(spec: KVCacheSpec) -> type[SingleTypeManager]:
    """The registered manager for `spec` (most specific spec class wins)."""
    for cls in type(spec).__mro__:
        if cls in SPEC_TO_MANAGER:
            return SPEC_TO_MANAGER[cls]
    raise ValueError(f"no manager registered for {type(spec).__name__}; "
                     f"use hybridkv.kv_cache.managers.register_manager")


__all__ = [
    "SPEC_TO_MANAGER", "SingleTypeManager", "FullAttentionManager", "SlidingWindowManager",
    "ChunkedLocalAttentionManager", "MambaManager", "SinkFullAttentionManager",
    "MambaStatePlan", "mamba_state_plan", "register_manager", "manager_class_for",
    "Protection", "Retention",
]
