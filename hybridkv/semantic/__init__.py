"""Semantic caching: answer a request that means the same as an earlier one
(same model, same tenant, same sampling) from the stored response.

See docs/semantic_cache.md. The pieces, bottom up: `embedding` (offline
sentence vectors), `normalize` (the exact-match key), `index` (ANN search),
`guards` (lexical vetoes), `memory_store` / `redis_store` (entries with TTL,
size bound, LRU), `thresholds` (fixed or learned under an error bound),
`cache` (lookup / insert / verify), `reuse` and `responses` (OpenAI bodies),
`front` (the HTTP wrapper used by the server and the router).
"""

from hybridkv.semantic.cache import Lookup, SemanticCache, open_store
from hybridkv.semantic.embedding import load_embedder
from hybridkv.semantic.guards import conflicts
from hybridkv.semantic.thresholds import ThresholdPolicy

__all__ = ["Lookup", "SemanticCache", "ThresholdPolicy", "conflicts", "load_embedder",
           "open_store"]
