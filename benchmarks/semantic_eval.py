"""The stream simulation behind bench_semantic_cache.py: a labeled question
stream through a semantic cache, counting served hits that were right or wrong.

Protocol: the groups of `hybridkv.semantic.labeled_pairs` are shuffled into
one stream (each group's base question first among its own). Each question
is looked up in one scope; a served hit is *right* when the entry's label
equals the question's, *false* otherwise; a miss (or a verification) runs
"the model", whose answer is the question's label, and stores it. With an
error bound, a verification compares labels, exactly as the server compares
answers. `reachable` counts questions whose label was already in the cache
(the ones a perfect cache would answer): recall = right hits / reachable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from hybridkv.semantic.cache import Lookup, SemanticCache
from hybridkv.semantic.memory_store import MemoryStore
from hybridkv.semantic.thresholds import ThresholdPolicy


@dataclass
class Outcome:
    served: int = 0
    false_hits: int = 0
    reachable: int = 0
    right: int = 0
    verified: int = 0
    questions: int = 0

    @property
    def precision(self) -> float:
        return 1.0 - self.false_hit_rate

    @property
    def false_hit_rate(self) -> float:
        return self.false_hits / self.served if self.served else 0.0

    @property
    def recall(self) -> float:
        return self.right / self.reachable if self.reachable else 0.0

    def row(self) -> dict[str, float]:
        return {"served": self.served, "false_hits": self.false_hits,
                "false_hit_rate": round(self.false_hit_rate, 4),
                "precision": round(self.precision, 4), "recall": round(self.recall, 4),
                "reachable": self.reachable, "verified": self.verified,
                "questions": self.questions}


def stream(groups, seed: int) -> list:
    """Questions of all groups interleaved at random, each group's base first."""
    rng = random.Random(seed)
    queues = [list(g[:1]) + rng.sample(g[1:], len(g) - 1) for g in groups]
    order = [i for i, q in enumerate(queues) for _ in q]
    rng.shuffle(order)
    return [queues[i].pop(0) for i in order]


class TableEmbedder:
    """Embeddings computed once for every text of the stream."""

    def __init__(self, texts: list[str], vectors: np.ndarray, name: str) -> None:
        self.text_to_row = {t: i for i, t in enumerate(texts)}
        self.vectors, self.dim, self.name = vectors, vectors.shape[1], name

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.vectors[[self.text_to_row[t] for t in texts]]


def run(questions, embedder, *, threshold: float, error_bound: float | None = None,
        guards: bool = True, seed: int = 0) -> Outcome:
    """Play `questions` (a stream) through a fresh in-memory cache."""
    store = MemoryStore(embedder.dim, max_entries=10**7, ttl_seconds=1e9)
    cache = SemanticCache(store, embedder, ThresholdPolicy(threshold, error_bound=error_bound,
                                                           seed=seed))
    if not guards:
        import hybridkv.semantic.cache as cache_module

        saved, cache_module.conflicts = cache_module.conflicts, lambda a, b, s=1.0: None
    try:
        return _play(cache, questions)
    finally:
        if not guards:
            cache_module.conflicts = saved


def _play(cache: SemanticCache, questions) -> Outcome:
    out, labels_stored = Outcome(), set()
    for q in questions:
        out.questions += 1
        out.reachable += q.label in labels_stored
        found: Lookup = cache.lookup("scope", q.text)
        if found.action == "serve":
            out.served += 1
            wrong = found.entry.answer != q.label
            out.false_hits += wrong
            out.right += not wrong
            continue
        if found.action == "verify":
            out.verified += 1
            cache.verify(found, q.label)
        cache.insert(found, q.label, "stop", 1)
        labels_stored.add(q.label)
    return out
