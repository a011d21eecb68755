"""When a similar entry may answer: a fixed global threshold, or thresholds
learned online under a user-set error bound.

Fixed (`error_bound=None`): a candidate at similarity `s` answers when
`s >= threshold` and its entry's own threshold.

Learned (`error_bound=δ`): every candidate at `s >= floor` is either served
or verified: the model runs anyway, the fresh answer is returned and
compared with the stored one, and the outcome (s, wrong) is recorded. The
rule for serving is

    serve with probability min(1, δ / u(s)),
    u(s) = (wrong + Z) / (seen + Z)   over outcomes with similarity in [s - W, s],

where `u(s)` is a pessimistic estimate of P(wrong | s): outcomes just below
`s` are at least as risky as `s` when the error falls with similarity, and
`Z = 3` is the rule-of-three margin (no wrong answer in `seen` trials bounds
the rate by about 3 / seen at 95%). A served answer is then wrong with
probability at most `min(1, δ/u) * P(wrong | s) <= δ` whenever `u(s)` bounds
the true rate; verified answers are always right. Cold, the cache verifies
almost everything; each verification teaches it, and once about 300
candidates near `s` have agreed the entries there are served outright.

Per entry: a verified wrong answer at similarity `s` raises that entry's own
threshold above `s`, so the same near-miss is never served by it again; an
entry's threshold is `max(global floor, its raises)`. Example: an entry for
"how do I reset my router" verified wrong at 0.93 for "how do I reset my
modem" answers nothing below 0.93 + 1e-6 from then on.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

RULE_OF_THREE = 3.0
WINDOW = 0.05
MAX_OUTCOMES = 50_000
RAISE = 1e-6


class ThresholdPolicy:
    """`decide(entry_id, s)` -> "serve" | "verify" | "miss"; `record` outcomes."""

    def __init__(self, threshold: float = 0.9, *, error_bound: float | None = None,
                 floor: float = 0.8, seed: int | None = None) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if error_bound is not None and not 0.0 < error_bound < 1.0:
            raise ValueError(f"error_bound must be in (0, 1), got {error_bound}")
        if not 0.0 < floor <= 1.0:
            raise ValueError(f"floor must be in (0, 1], got {floor}")
        self.threshold = threshold
        self.error_bound = error_bound
        self.floor = min(floor, threshold)
        self.entry_to_threshold: dict[int, float] = {}
        self.outcomes: deque[tuple[float, bool]] = deque(maxlen=MAX_OUTCOMES)
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self.random = random.Random(seed)

    @property
    def learning(self) -> bool:
        return self.error_bound is not None

    @property
    def search_floor(self) -> float:
        """The lowest similarity worth a look."""
        return self.floor if self.learning else self.threshold

    def entry_threshold(self, entry_id: int) -> float:
        base = self.floor if self.learning else self.threshold
        return max(base, self.entry_to_threshold.get(entry_id, 0.0))

    def decide(self, entry_id: int, similarity: float) -> str:
        """What to do with a candidate entry at `similarity` (lexical checks passed)."""
        if similarity < self.entry_threshold(entry_id):
            return "miss"
        if self.error_bound is None:
            return "serve"
        chance = min(1.0, self.error_bound / self.risk(similarity))
        return "serve" if self.random.random() < chance else "verify"

    def risk(self, similarity: float) -> float:
        """u(s): the pessimistic error estimate above (1.0 with no outcomes)."""
        sims, wrong = self._outcome_arrays()
        near = (sims <= similarity) & (sims >= similarity - WINDOW)
        seen, bad = int(near.sum()), int(wrong[near].sum())
        return min(1.0, (bad + RULE_OF_THREE) / (seen + RULE_OF_THREE))

    def record(self, entry_id: int, similarity: float, wrong: bool) -> None:
        """A verified outcome; a wrong one raises the entry's threshold above it."""
        self.outcomes.append((similarity, wrong))
        self._arrays = None
        if wrong:
            raised = max(self.entry_to_threshold.get(entry_id, 0.0), similarity + RAISE)
            self.entry_to_threshold[entry_id] = raised

    def forget(self, entry_id: int) -> None:
        self.entry_to_threshold.pop(entry_id, None)

    def _outcome_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            pairs = np.array(self.outcomes, dtype=np.float64).reshape(-1, 2)
            self._arrays = (pairs[:, 0], pairs[:, 1].astype(bool))
        return self._arrays
