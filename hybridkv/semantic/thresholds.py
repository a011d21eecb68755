"""When a similar entry may answer: a fixed global threshold, or thresholds
learned online under a user-set error bound.

Fixed (`error_bound=None`): a candidate at similarity `s` answers when
`s >= threshold` and its entry's own threshold.

Learned (`error_bound=δ`): every candidate at `s >= floor` is either served
or verified: the model runs anyway, the fresh answer is returned and
compared with the stored one, and the outcome (s, wrong) is recorded. A
candidate is served only when

    u(s) = (wrong + Z) / (seen + Z) <= δ   over outcomes with similarity in [s - W, s]

(W = 0.02), and then still verified with probability `EXPLORE`. `u(s)` is a
pessimistic estimate of P(wrong | s): outcomes just below `s` are at least
as risky as `s` when the error falls with similarity, and `Z = 3` is the
rule-of-three margin (no wrong answer in `seen` trials bounds the rate by
about 3 / seen at 95%). Every served answer then comes from a similarity
whose error rate is bounded by δ, so wrong answers are at most about δ of
the served ones; verified answers are always right. Cold, the cache
verifies everything; once about 300 candidates just below `s` have agreed,
candidates at `s` are served.

Per entry: a verified wrong answer at similarity `s` raises that entry's own
threshold above `s`, so the same near-miss is never served by it again; an
entry's threshold is `max(global floor, its raises)`. Example: an entry for
"how do I reset my router" verified wrong at 0.93 for "how do I reset my
modem" answers nothing below 0.93 + 1e-6 from then on.
"""

from __future__ import annotations

import random

import numpy as np

RULE_OF_THREE = 3.0
WINDOW = 0.02
NUM_BINS = 400  # outcomes are counted in similarity bins of 1/NUM_BINS
RAISE = 1e-6
EXPLORE = 0.02  # share of servable candidates still verified, to keep learning


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
        self.seen = np.zeros(NUM_BINS + 1, np.int64)  # outcomes per similarity bin
        self.wrong = np.zeros(NUM_BINS + 1, np.int64)
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
        if self.risk(similarity) > self.error_bound or self.random.random() < EXPLORE:
            return "verify"
        return "serve"

    def risk(self, similarity: float) -> float:
        """u(s): the pessimistic error estimate above (1.0 with no outcomes)."""
        low, high = _bin(similarity - WINDOW), _bin(similarity) + 1
        seen, bad = int(self.seen[low:high].sum()), int(self.wrong[low:high].sum())
        return min(1.0, (bad + RULE_OF_THREE) / (seen + RULE_OF_THREE))

    def record(self, entry_id: int, similarity: float, wrong: bool) -> None:
        """A verified outcome; a wrong one raises the entry's threshold above it."""
        self.seen[_bin(similarity)] += 1
        self.wrong[_bin(similarity)] += wrong
        if wrong:
            raised = max(self.entry_to_threshold.get(entry_id, 0.0), similarity + RAISE)
            self.entry_to_threshold[entry_id] = raised

    def forget(self, entry_id: int) -> None:
        self.entry_to_threshold.pop(entry_id, None)


def _bin(similarity: float) -> int:
    return int(min(max(similarity, 0.0), 1.0) * NUM_BINS)
