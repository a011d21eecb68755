"""Routing policies: which instance serves a request.

Every policy sees, per eligible instance (healthy, same model), the prompt
tokens it could reuse, the full-attention chain it caches, and its load:

- `hybrid-prefix` (default): the least estimated work before the first token,

      (prompt tokens - reusable tokens)
          + balance * (pending_tokens + REQUEST_TOKENS * excess_requests)

  where reusable tokens follow every group's reuse rule (windows, Mamba
  states, chunks), `pending_tokens` are the prompt tokens the instance
  still has to compute for requests already sent to it (its queue and its
  running prefills), and `excess_requests` is how many more requests it has
  in hand than the average eligible instance (0 when at or below it). The
  request term moves sessions and popular documents off instances that
  decode for many requests (pending tokens see only prefills) without
  moving anything between lightly loaded ones, where a move would only
  recompute a prefix. `balance` is the one knob (default 0.4: a queued token
  costs 0.4 of a recomputed one, since a prefix computed twice also takes
  pool space from other prefixes); 0 routes by cache alone, large values
  approach least-loaded. REQUEST_TOKENS (288, so a request beyond the
  average weighs 115 tokens at the default balance) is a constant. Both
  were chosen on the cluster simulation (benchmarks/RESULTS.md, "Routing
  across a simulated cluster"): balance 0.35-0.5 and 64-384 tokens were
  tried, and a term on every request in hand instead of the excess, which
  cost hit rate where every instance is busy.
- `prefix`: the longest cached full-attention chain (what routers that match
  one hash chain see), ties to the least loaded; no other load term.
- `prefix-balanced`: as `hybrid-prefix` but crediting the full-attention
  chain instead of the reusable tokens (a chain-matching router with a load
  term; it shows what hybrid awareness alone adds).
- `least-loaded`: the fewest requests in hand, then the fewest pending tokens.
- `round-robin`: each eligible instance in turn.

Ties go to the instance with fewer requests in flight (sent by this router),
then to the next one in turn. Load costs are kept per eligible instance and
updated when a load changes (`LoadCosts`), so a decision reads them in O(1)
per instance with credit plus one `min` over the list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

POLICIES = ("hybrid-prefix", "prefix", "prefix-balanced", "least-loaded", "round-robin")
DEFAULT_POLICY = "hybrid-prefix"
DEFAULT_BALANCE = 0.4
# weight of a request in flight in a cost: breaks ties between equal token costs
TIE = 1e-6
# prompt tokens a request in hand beyond the average counts as (`hybrid-prefix`)
REQUEST_TOKENS = 288
# the average the excess is taken over is refreshed once it moved this much
MEAN_SLACK = 0.5


def check_policy(name: object) -> str:
    if not isinstance(name, str) or name not in POLICIES:
        raise ValueError(f"routing policy {name!r} is unknown; use one of {', '.join(POLICIES)}")
    return name


def check_balance(balance: object) -> float:
    if isinstance(balance, bool) or not isinstance(balance, int | float) or not balance >= 0:
        raise ValueError(f"balance must be a number >= 0, got {balance!r}")
    return float(balance)


@dataclass(slots=True)
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


class LoadCosts:
    """The load part of the cost of each eligible instance (lower is better),
    kept current as loads change: `costs[i]` for position i.

    A decision subtracts the credited tokens and takes the least (`choose`).
    For `hybrid-prefix` and `prefix-balanced` the average requests in hand it
    counts the excess over is refreshed (every cost recomputed) once the
    true average moved MEAN_SLACK away from it.
    """

    def __init__(self, policy: str, balance: float) -> None:
        self.policy = policy
        self.balance = balance
        self.costs: list[float] = []
        self.loads: list[Load] = []
        self.mean = 0.0  # the average requests in hand the costs use
        self._total = 0  # requests in hand, summed over the positions
        self._excess = policy in ("hybrid-prefix", "prefix-balanced")

    def add(self, load: Load) -> int:
        """Append an instance's load; its position. (Call `refresh` once all are in.)"""
        self.loads.append(load)
        self._total += load.num_requests
        self.costs.append(self._cost(load))
        return len(self.loads) - 1

    def refresh(self) -> None:
        """Recompute every cost from the true average."""
        self._refresh_mean(force=True)

    def changed(self, position: int, old_requests: int) -> None:
        """The load at `position` changed (it had `old_requests` in hand)."""
        load = self.loads[position]
        self._total += load.num_requests - old_requests
        if not self._refresh_mean():
            self.costs[position] = self._cost(load)

    def _refresh_mean(self, force: bool = False) -> bool:
        """Recompute every cost if the average moved; whether it did."""
        if not self._excess:
            return False
        mean = self._total / len(self.loads)
        if not force and abs(mean - self.mean) < MEAN_SLACK:
            return False
        self.mean = mean
        self.costs[:] = [self._cost(load) for load in self.loads]
        return True

    def _cost(self, load: Load) -> float:
        policy = self.policy
        if self._excess:
            excess = max(0.0, load.num_requests - self.mean)
            return self.balance * (load.pending_tokens + REQUEST_TOKENS * excess) \
                + load.in_flight * TIE
        if policy == "least-loaded":
            return load.num_requests * 2.0**32 + load.pending_tokens
        if policy == "prefix":
            return load.in_flight * TIE
        return 0.0


def choose(policy: str, costs: list[float], credit: Sequence[tuple[int, float]],
           turn: int) -> tuple[int, float]:
    """(position, cost) of the instance to route to, for `costs` (non-empty) the
    load costs of the eligible positions.

    `credit` lists (position, tokens): the reusable tokens (`hybrid-prefix`) or
    chain tokens (`prefix`, `prefix-balanced`) of the positions that have
    any, subtracted from their costs. Among equal costs the first at or after
    position `turn` (cyclically) wins.
    """
    n = len(costs)
    if policy == "round-robin":
        return turn % n, 0.0
    if credit:
        costs = costs.copy()
        for i, tokens in credit:
            costs[i] -= tokens
    best = min(costs)
    try:
        return costs.index(best, turn % n), best
    except ValueError:
        return costs.index(best), best
