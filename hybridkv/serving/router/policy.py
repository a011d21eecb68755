"""Routing policies: which instance serves a request.

Every policy sees, per eligible instance (healthy, same model), the prompt
tokens it could reuse, the full-attention chain it caches, and its load:

- `hybrid-prefix` (default): the least estimated work before the first token,
  `(prompt tokens - reusable tokens) + balance * pending_tokens`, where
  reusable tokens follow every group's reuse rule (windows, Mamba states,
  chunks) and `pending_tokens` are the prompt tokens the instance still has
  to compute for requests already sent to it (its queue and its running
  prefills). `balance` is the one knob (default 0.5: a queued token costs
  half a recomputed one, since a prefix computed twice also takes pool space
  from other prefixes); 0 routes by cache alone, large values approach
  least-loaded.
- `prefix`: the longest cached full-attention chain (what routers that match
  one hash chain see), ties to the least loaded; no other load term.
- `prefix-balanced`: as `hybrid-prefix` but crediting the full-attention
  chain instead of the reusable tokens (a chain-matching router with a load
  term; it shows what hybrid awareness alone adds).
- `least-loaded`: the fewest requests in flight, then the fewest pending tokens.
- `round-robin`: each eligible instance in turn.

Ties go to the instance with fewer requests in flight (sent by this router),
then to the next one in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POLICIES = ("hybrid-prefix", "prefix", "prefix-balanced", "least-loaded", "round-robin")
DEFAULT_POLICY = "hybrid-prefix"
DEFAULT_BALANCE = 0.5
# weight of a request in flight in a cost: breaks ties between equal token costs
TIE = 1e-6


def check_policy(name: object) -> str:
    if not isinstance(name, str) or name not in POLICIES:
        raise ValueError(f"routing policy {name!r} is unknown; use one of {', '.join(POLICIES)}")
    return name


def check_balance(balance: object) -> float:
    if isinstance(balance, bool) or not isinstance(balance, int | float) or not balance >= 0:
        raise ValueError(f"balance must be a number >= 0, got {balance!r}")
    return float(balance)


@dataclass
class Load:
    """What an instance has in hand, as the router knows it.

    `in_flight`: requests sent and not finished; `pending_tokens`: prompt
    tokens of those requests not yet computed (estimated when routed,
    cleared at the first token); `waiting`/`running`: the instance's own
    counts from its metrics, when polled.
    """

    in_flight: int = 0
    pending_tokens: int = 0
    waiting: int = 0
    running: int = 0

    @property
    def num_requests(self) -> int:
        """Requests in hand: the router's own count, or the instance's if larger."""
        return max(self.in_flight, self.waiting + self.running)


def choose(policy: str, slots: list[int], loads: list[Load], credit: list[tuple[int, int]],
           balance: float, turn: int) -> int:
    """The position in `slots` (non-empty) to route to.

    `loads[i]` is the load of `slots[i]`; `credit` lists (position, tokens):
    the reusable tokens (`hybrid-prefix`) or chain tokens (`prefix`,
    `prefix-balanced`) of the positions that have any. Among equal costs the
    first at or after position `turn` (cyclically) wins.
    """
    n = len(slots)
    if policy == "round-robin":
        return turn % n
    costs: list[Any]
    if policy == "least-loaded":
        costs = [(ld.num_requests, ld.pending_tokens) for ld in loads]
    elif policy == "prefix":
        costs = [ld.in_flight * TIE for ld in loads]
        for i, tokens in credit:
            costs[i] -= tokens
    else:
        costs = [balance * ld.pending_tokens + ld.in_flight * TIE for ld in loads]
        for i, tokens in credit:
            costs[i] -= tokens
    best = min(costs)
    start = turn % n
    try:
        return costs.index(best, start)
    except ValueError:
        return costs.index(best)
