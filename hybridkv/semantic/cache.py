"""The lookup/insert front: normalised exact match first, then the nearest
entries of the request's scope, the lexical checks, and the threshold policy.

    cache = SemanticCache.from_url("memory://", embedder)
    found = cache.lookup(scope, "What's the capital of France?")
    if found.action == "serve": answer with found.entry.answer
    else: run the model, then cache.insert(found, answer, ...) and, when
          found.action == "verify", cache.verify(found, answer)
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np

from hybridkv.semantic.embedding import Embedder
from hybridkv.semantic.entry import Entry
from hybridkv.semantic.guards import conflicts
from hybridkv.semantic.memory_store import MemoryStore
from hybridkv.semantic.metrics import SemanticMetrics
from hybridkv.semantic.normalize import normalize
from hybridkv.semantic.thresholds import ThresholdPolicy

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_TTL_SECONDS = 24 * 3600.0
NUM_CANDIDATES = 4
MAX_FETCHES = 2


@dataclass(slots=True)
class Lookup:
    """A lookup's outcome: `action` is "serve", "verify" or "miss"; `entry` and
    `similarity` name the candidate (None for a plain miss)."""

    scope: str
    text: str
    key: str
    vector: np.ndarray
    action: str
    entry: Entry | None = None
    similarity: float = 0.0
    exact: bool = False


def same_answer(a: str, b: str) -> bool:
    """Whether two answers agree: equal up to case, spacing and edge punctuation."""
    return normalize(a) == normalize(b)


class SemanticCache:
    """Scoped semantic cache over an entry store (memory or Redis)."""

    def __init__(self, store: Any, embedder: Embedder, policy: ThresholdPolicy,
                 metrics: SemanticMetrics | None = None) -> None:
        self.store = store
        self.embedder = embedder
        self.policy = policy
        self.metrics = metrics if metrics is not None else SemanticMetrics()
        self.is_remote = not isinstance(store, MemoryStore)
        self._ids = itertools.count(1)
        self._id_base = (int.from_bytes(secrets.token_bytes(4), "big") << 24) ^ os.getpid()

    @classmethod
    def from_url(cls, url: str, embedder: Embedder, *, threshold: float = 0.9,
                 error_bound: float | None = None, metrics: SemanticMetrics | None = None,
                 seed: int | None = None) -> SemanticCache:
        """`memory://[?size=N&ttl=S]` or `redis://host:port/db[?size=N&ttl=S]`."""
        store = open_store(url, embedder.dim)
        return cls(store, embedder, ThresholdPolicy(threshold, error_bound=error_bound,
                                                    seed=seed), metrics)

    def lookup(self, scope: str, text: str) -> Lookup:
        """Search for an entry that answers `text` in `scope`; records the latency."""
        start = time.perf_counter()
        found = self._lookup(scope, text)
        self.metrics.latency.observe(time.perf_counter() - start)
        if found.action == "serve":
            self.metrics.hits.labels(kind="exact" if found.exact else "similar").inc()
        else:
            self.metrics.misses.inc()
        self.metrics.track(self.store)
        return found

    def insert(self, found: Lookup, answer: str, finish_reason: str,
               completion_tokens: int | None) -> None:
        """Store the model's answer to the looked-up request."""
        entry = Entry(self._next_id(), found.scope, found.key, found.text, found.vector,
                      answer, finish_reason, completion_tokens, time.time())
        self.store.put(entry)
        self.metrics.track(self.store)

    def verify(self, found: Lookup, fresh_answer: str) -> bool:
        """Compare the model's answer with the candidate's; teach the policy. True
        when they agree."""
        assert found.entry is not None, "verify needs a candidate"
        agreed = same_answer(found.entry.answer, fresh_answer)
        self.policy.record(found.entry.id, found.similarity, not agreed)
        self.metrics.verifications.inc()
        if not agreed:
            self.metrics.false_hits.inc()
        return agreed

    def close(self) -> None:
        self.store.close()

    # ---- internals -----------------------------------------------------------

    def _lookup(self, scope: str, text: str) -> Lookup:
        key = normalize(text)
        vector = self.embedder.embed([text])[0]
        found = Lookup(scope, text, key, vector, "miss")
        exact_id = self.store.exact(scope, key)
        if exact_id is not None:
            entry = self.store.get(exact_id)
            if entry is not None and entry.key == key:
                found.entry, found.similarity, found.exact, found.action = entry, 1.0, True, \
                    "serve"
                return found
        fetched = 0
        for entry_id, similarity in self.store.search(scope, vector, NUM_CANDIDATES):
            if similarity < self.policy.search_floor or fetched >= MAX_FETCHES:
                break
            if similarity < self.policy.entry_threshold(entry_id):
                continue
            entry = self.store.get(entry_id)
            fetched += 1
            if entry is None or entry.scope != scope or conflicts(text, entry.text, similarity):
                continue
            found.entry, found.similarity = entry, similarity
            found.action = self.policy.decide(entry_id, similarity)
            return found
        return found

    def _next_id(self) -> int:
        return (self._id_base + next(self._ids)) & ((1 << 63) - 1)


def open_store(url: str, dim: int) -> Any:
    """The entry store a URL names; ValueError naming the URL when it is not one."""
    parsed = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    try:
        size = int(query.pop("size", DEFAULT_MAX_ENTRIES))
        ttl = float(query.pop("ttl", DEFAULT_TTL_SECONDS))
    except ValueError:
        raise ValueError(f"--semantic-cache {url!r}: size and ttl must be numbers") from None
    if query:
        raise ValueError(f"--semantic-cache {url!r}: unknown option(s) {sorted(query)}")
    if parsed.scheme == "memory":
        return MemoryStore(dim, max_entries=size, ttl_seconds=ttl)
    if parsed.scheme in ("redis", "rediss", "unix"):
        from hybridkv.semantic.redis_store import RedisStore

        return RedisStore(url.split("?")[0], dim, max_entries=size, ttl_seconds=ttl)
    raise ValueError(f"--semantic-cache {url!r} is not memory:// or redis://host:port/db")
