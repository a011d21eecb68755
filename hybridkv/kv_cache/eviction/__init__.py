"""Eviction policies: which free block is taken when new data needs one.

`base` defines the policy interface and the ratings groups give released
blocks; `hybrid` (the default: five rules, with a C twin) and `lru` are the
built-in policies. Policies are picked by
name from `EVICTION_POLICIES`, a registry users extend with
`register_eviction_policy`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hybridkv.kv_cache import fastpath
from hybridkv.kv_cache.eviction.base import (
    JUNCTION,
    LOW_VALUE,
    NORMAL_VALUE,
    PROTECTED,
    EvictionPolicy,
    Rating,
)
from hybridkv.kv_cache.eviction.hybrid import HybridPolicy, HybridRules
from hybridkv.kv_cache.eviction.lru import LRUPolicy

if TYPE_CHECKING:
    from hybridkv.kv_cache.block_pool import Block

EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    "lru": LRUPolicy, "hybrid": HybridPolicy}
# the default: five rules over the groups' ratings (hybrid.py), on its C twin
DEFAULT_EVICTION_POLICY = "hybrid"


def register_eviction_policy(name: str, policy_class: type[EvictionPolicy]) -> None:
    """Make `policy_class` available as `eviction_policy=name`."""
    if not (isinstance(policy_class, type) and issubclass(policy_class, EvictionPolicy)):
        raise ValueError(f"eviction policy {name!r} must subclass EvictionPolicy")
    EVICTION_POLICIES[name] = policy_class


def make_eviction_policy(name: str, blocks: Iterable[Block],
                         backend: str | None = None) -> EvictionPolicy:
    """The policy registered as `name`, holding `blocks` as free, in the class that runs
    it under the manager backend `backend` (`fastpath.resolve_backend`: None is the
    default backend); ValueError if unknown."""
    if name not in EVICTION_POLICIES:
        raise ValueError(f"eviction_policy: unknown policy {name!r}; "
                         f"use one of {sorted(EVICTION_POLICIES)}")
    return EVICTION_POLICIES[name].for_backend(fastpath.resolve_backend(backend))(blocks)


__all__ = [
    "DEFAULT_EVICTION_POLICY", "EVICTION_POLICIES", "EvictionPolicy", "HybridPolicy",
    "HybridRules",
    "JUNCTION", "LOW_VALUE", "LRUPolicy", "NORMAL_VALUE", "PROTECTED", "Rating",
    "make_eviction_policy", "register_eviction_policy",
]
