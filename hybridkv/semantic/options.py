"""The `--semantic-*` options of `hybridkv serve` and `hybridkv route`, and the
front they build."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

DEFAULT_THRESHOLD = 0.9


def add_semantic_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--semantic-cache", default=None, metavar="URL",
                   help="answer requests that mean the same as an earlier one from the "
                        "stored response: memory:// or redis://host:port/db "
                        "(options ?size=ENTRIES&ttl=SECONDS)")
    p.add_argument("--semantic-embedding", default=None, metavar="DIR",
                   help="a local sentence-transformers directory (default: the static "
                        "model bundled in the wordllama package)")
    p.add_argument("--semantic-threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="cosine similarity at or above which an entry answers "
                        f"(default {DEFAULT_THRESHOLD})")
    p.add_argument("--semantic-error-bound", type=float, default=None, metavar="DELTA",
                   help="learn thresholds online: sometimes run the model on a candidate "
                        "hit and compare, so that at most DELTA of served hits are wrong "
                        "(e.g. 0.01)")


def build_front(args: argparse.Namespace, model_name: str, registry: Any,
                count_tokens: Callable[[str], int] | None = None) -> Any:
    """The `SemanticFront` the options ask for, or None without `--semantic-cache`.
    ValueError naming the option when one is invalid."""
    url = getattr(args, "semantic_cache", None)
    if url is None:
        return None
    from hybridkv.semantic.cache import SemanticCache
    from hybridkv.semantic.embedding import load_embedder
    from hybridkv.semantic.front import SemanticFront
    from hybridkv.semantic.metrics import SemanticMetrics

    if not 0.0 < args.semantic_threshold <= 1.0:
        raise ValueError(f"--semantic-threshold must be in (0, 1], got {args.semantic_threshold}")
    bound = args.semantic_error_bound
    if bound is not None and not 0.0 < bound < 1.0:
        raise ValueError(f"--semantic-error-bound must be in (0, 1), got {bound}")
    cache = SemanticCache.from_url(url, load_embedder(args.semantic_embedding),
                                   threshold=args.semantic_threshold, error_bound=bound,
                                   metrics=SemanticMetrics(registry))
    return SemanticFront(cache, model_name, count_tokens)
