"""PrefixCacheStats: what a KVCacheManager's lookups found, counted since it was built."""

from __future__ import annotations

from dataclasses import dataclass, field

# lookups of one prompt start that found nothing before a warning is issued
REPEATED_MISS_WARNING = 3


@dataclass
class PrefixCacheStats:
    """Cumulative counters; reading them resets nothing.

    `queries` and `hits` count tokens (prompt tokens looked up, tokens
    reused); `requests` counts lookups. Per group: `group_hits[g]`, the
    tokens group g alone could have reused (up to the full-attention match);
    `group_evictions[g]`, cached blocks of g recycled for new data.
    `stranded_tokens`: tokens whose full-attention blocks were cached but
    unusable because another group (a window, a Mamba state) was missing.
    `repeated_miss_prefixes`: prompt starts looked up `REPEATED_MISS_WARNING`
    times that found nothing reusable each time (the first one warns, see
    `KVCacheManager`).
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    stranded_tokens: int = 0
    evictions: int = 0
    repeated_miss_prefixes: int = 0
    group_hits: list[int] = field(default_factory=list)
    group_evictions: list[int] = field(default_factory=list)

    def group_hit_rate(self, group_id: int) -> float:
        return self.group_hits[group_id] / self.queries if self.queries else 0.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
