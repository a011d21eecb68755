"""The `--semantic-*` options of `hybridkv serve` and `hybridkv route`, and the
front they build."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

DEFAULT_THRESHOLD = 0.9
DEFAULT_ERROR_BOUND = 0.01


def error_bound(text: str) -> float | None:
    """`--semantic-error-bound`: a number, or `none` for the fixed threshold alone."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number in (0, 1) or 'none', got {text!r}") from None


def add_semantic_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--semantic-cache", default=None, metavar="URL",
                   help="answer requests that mean the same as an earlier one from the "
                        "stored response: memory:// or redis://host:port/db "
                        "(options ?size=ENTRIES&ttl=SECONDS)")
    p.add_argument("--semantic-embedding", default=None, metavar="DIR",
                   help="a local sentence-transformers directory (default: the static "
                        "model bundled in the wordllama package)")
    p.add_argument("--semantic-threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="with --semantic-error-bound none: cosine similarity at or above "
                        f"which an entry answers (default {DEFAULT_THRESHOLD}); while "
                        "learning, candidates below min(0.8, this) are not looked at")
    p.add_argument("--semantic-error-bound", type=error_bound, default=DEFAULT_ERROR_BOUND,
                   metavar="DELTA",
                   help="learn thresholds online: run the model on candidate hits and "
                        "compare until at most DELTA of served hits are estimated wrong "
                        f"(default {DEFAULT_ERROR_BOUND}); 'none': serve every candidate "
                        "at or above --semantic-threshold")


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
