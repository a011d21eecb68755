"""What a shared Redis KV store holds for a prompt, as the router counts it.

Backends started with `hybridkv serve --kv-store redis://...` write the
blocks their pools evict to that store, and any backend of the same model
and cache layout can load them back instead of computing them. A backend's
`GET /v1/kv_cache_layout` names its store (`kv_store`: `url` without
credentials, key `prefix`, and the layout `fingerprint` that every key of
that model and layout carries). `hybridkv route --kv-store URL` binds the
backends whose store is the same server, database and prefix, and for each
request asks the store which of the prompt's blocks it holds:

    key = <prefix>:  b"hkv1" | fingerprint (16 B) | group id (u16 BE) | block hash

(`hybridkv.store.keys`; the block hash is the salted chain hash, so a
request only ever matches blocks stored under its own `cache_salt`). One
round trip per request and fingerprint: a server-side script gets the keys'
common prefix and their (group id, hash) tails packed in one argument, runs
EXISTS on every key and answers one string of 0/1, so no payload is read and
the client encodes two arguments instead of a thousand keys. (The script
names its keys itself, so the store must be one Redis server, not a cluster,
as for the backends' own multi-key reads.) The answer,
per index, maps a hash to packed bits (`PrefixIndex.lookup(..., extra=)`):
a bound slot's bit is set in a class's field when every group of the class
has the block in the store or in that backend's pool (as the backend's tier
combines them: a group's rule is met when each block it needs is in either).

A store that fails or times out is left alone for a back-off delay (0.5 s
doubling to 30 s; one warning per outage); routing goes on with the
backends' pools alone.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Mapping
from typing import Any

from hybridkv.serving.router.index import PrefixIndex
from hybridkv.serving.router.routing import PromptHashes, Router
from hybridkv.store.keys import FINGERPRINT_BYTES, KEY_PREFIX
from hybridkv.store.url import parse_store_url

logger = logging.getLogger("hybridkv.router")

# EXISTS on ARGV[1] .. every ARGV[3]-byte record of ARGV[2], answered as one
# string of "0"/"1" (two arguments to encode, one reply to parse)
EXISTS_SCRIPT = """
local prefix, tails, size = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
for i = 1, #tails, size do
  local key = prefix .. string.sub(tails, i, i + size - 1)
  out[#out + 1] = redis.call('EXISTS', key) == 1 and '1' or '0'
end
return table.concat(out)
"""
MAX_KEYS = 8192  # keys asked per request and fingerprint (longer prompts: their start)
BACKOFF_S = (0.5, 30.0)


class StoreView:
    """The router's window on one shared Redis KV store (`--kv-store URL`)."""

    def __init__(self, url: str, router: Router, *, timeout: float = 0.5) -> None:
        import redis.asyncio as aioredis

        u = parse_store_url(url)
        if u.scheme != "redis":
            raise ValueError(f"--kv-store {url!r}: the router reads only a shared "
                             f"redis:// store")
        self.url = u.describe()
        self.prefix = u.options.get("prefix", "hkv")
        self.router = router
        self.redis = aioredis.Redis(host=u.host, port=u.port, db=u.db, username=u.username,
                                    password=u.password, socket_timeout=timeout,
                                    socket_connect_timeout=timeout)
        self._exists = self.redis.register_script(EXISTS_SCRIPT)
        self._key_prefix = self.prefix.encode() + b":"
        self.bound: dict[str, bytes] = {}  # instance id -> layout fingerprint
        self.num_queries = 0
        self.num_errors = 0
        self._retry_at = 0.0
        self._backoff = BACKOFF_S[0]

    # ---- backends ----------------------------------------------------------------

    def bind(self, instance_id: str, layout: Mapping[str, Any]) -> bool:
        """Count the store for this backend if its layout names this store;
        whether it does."""
        store = layout.get("kv_store")
        self.bound.pop(instance_id, None)
        if not isinstance(store, Mapping) or store.get("url") != self.url \
                or store.get("prefix", "hkv") != self.prefix:
            return False
        try:
            fingerprint = bytes.fromhex(str(store.get("fingerprint")))
        except ValueError:
            fingerprint = b""
        if len(fingerprint) != FINGERPRINT_BYTES:
            logger.warning("backend %s names kv store %s with a bad fingerprint %r; not "
                           "counting the store for it", instance_id, self.url,
                           store.get("fingerprint"))
            return False
        self.bound[instance_id] = fingerprint
        return True

    # ---- queries -----------------------------------------------------------------

    async def stored(self, prompt: PromptHashes) -> dict[PrefixIndex, dict[bytes, int]]:
        """Per index, hash -> packed bits of what the store holds for the prompt,
        set for the slots bound to it; {} when nothing is bound or the store is
        down (or backing off)."""
        targets = self._targets()
        if not targets or time.monotonic() < self._retry_at:
            return {}
        import redis

        out: dict[PrefixIndex, dict[bytes, int]] = {}
        try:
            for (index, fingerprint), slots in targets.items():
                hashes = prompt.get(index)
                tails, spots = self._tails(index, hashes, len(prompt.token_ids) - 1)
                if not spots:
                    continue
                self.num_queries += 1
                reply = await self._exists(
                    args=[self._key_prefix + KEY_PREFIX + fingerprint, tails,
                          len(tails) // len(spots)])
                extra = out.setdefault(index, {})
                _merge(extra, index, hashes, spots, reply, slots)
        except (redis.RedisError, OSError) as err:
            self._failed(err)
            return {}
        self._backoff = BACKOFF_S[0]
        return out

    def _targets(self) -> dict[tuple[PrefixIndex, bytes], list[tuple[str, int]]]:
        """(index, fingerprint) -> the bound healthy backends: (instance id, slot)."""
        out: dict[tuple[PrefixIndex, bytes], list[tuple[str, int]]] = {}
        for instance_id, fingerprint in self.bound.items():
            backend = self.router.backends.get(instance_id)
            if backend is None or not backend.healthy:
                continue
            out.setdefault((backend.index, fingerprint), []).append((instance_id, backend.bit))
        return out

    def _tails(self, index: PrefixIndex, hashes: list[bytes],
               max_tokens: int) -> tuple[bytes, list[tuple[int, int]]]:
        """Every group's blocks up to the longest possible hit: their key tails
        (group id, u16 big-endian, then the block hash) packed into one
        string, and per tail (group, hash position)."""
        layout = index.layout
        step = layout.alignment // index.hash_block_size
        top = min(max_tokens // layout.alignment * step, len(hashes) // step * step)
        strides = [spec.block_size // index.hash_block_size for spec in layout.specs]
        per_block = sum(1 / s for s in strides)
        top = min(top, int(MAX_KEYS / per_block) // step * step)
        parts: list[bytes] = []
        spots: list[tuple[int, int]] = []
        for g, stride in enumerate(strides):
            positions = range(stride - 1, top, stride)
            group = struct.pack(">H", g)
            parts += [group + hashes[j] for j in positions]
            spots += [(g, j) for j in positions]
        return b"".join(parts), spots

    def _failed(self, err: BaseException) -> None:
        self.num_errors += 1
        if self._backoff == BACKOFF_S[0]:
            logger.warning("kv store %s: %s; routing by the backends' pools alone, retrying "
                           "in %.1fs (backing off)", self.url, err, self._backoff)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(2 * self._backoff, BACKOFF_S[1])

    async def close(self) -> None:
        await self.redis.aclose()


def _merge(extra: dict[bytes, int], index: PrefixIndex, hashes: list[bytes],
           spots: list[tuple[int, int]], reply: bytes, bound: list[tuple[str, int]]) -> None:
    """OR into `extra`, per class and hash position, the bits of the bound
    slots for which every group of the class has the block in the store
    ("1" in `reply`, one character per spot) or in the backend's pool."""
    stored: dict[tuple[int, int], int] = {}  # (class, position) -> groups stored
    group_class, group_bit = index.group_class, index.group_bit
    for (g, j), ok in zip(spots, reply):
        if ok == 49:  # "1"
            key = (group_class[g], j)
            stored[key] = stored.get(key, 0) | group_bit[g]
    every = sum(1 << slot for _, slot in bound)
    full, width = index.class_full, index.width
    for (c, j), groups in stored.items():
        h = hashes[j]
        if groups == full[c]:
            slots = every
        else:  # the rest of the class's groups must be in the backend's own pool
            slots = sum(1 << slot for instance_id, slot in bound
                        if groups | index.held_groups(instance_id, c, h) == full[c])
        if slots:
            extra[h] = extra.get(h, 0) | (slots << (c * width))
