"""Attach a KV store to an engine's pool: `attach_store(kv, url, config, slots, model)`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.store.base import KVStore
from hybridkv.store.fingerprint import model_digest
from hybridkv.store.keys import layout_fingerprint
from hybridkv.store.pages import TorchPages
from hybridkv.store.tier import KVTier
from hybridkv.store.url import open_store

DEFAULT_URL = "cpu://"


def attach_store(kv: KVCacheManager, store: str | KVStore | bool, config: KVCacheConfig,
                 slots: Sequence[torch.Tensor], model: nn.Module, *,
                 write_through: bool = False, select: str = "hybrid") -> KVTier:
    """A KVTier between `kv`'s pool (pages in `slots`) and the store at `store`.

    `store`: a URL (`cpu://?size=4GiB`, `file:///dir?size=20GiB`,
    `redis://host:port/db`), a KVStore, or True for `cpu://` (4 GiB). The
    keys' fingerprint covers `model`'s config and weights and the layout.
    Raises ValueError for a bad URL or when prefix caching is off.
    """
    if not kv.enable_caching:
        raise ValueError("kv_store needs enable_prefix_caching=True (blocks are found by "
                         "their prefix hashes)")
    if store is True:
        store = DEFAULT_URL
    if not isinstance(store, str | KVStore):
        raise ValueError(f"kv_store must be a URL, a KVStore or True, got {store!r}")
    fingerprint = layout_fingerprint(model_digest(model), config, kv.hash_algo)
    pages = TorchPages(config, slots)
    opened = open_store(store)
    return KVTier(kv, opened, pages, fingerprint, write_through=write_through, select=select)
