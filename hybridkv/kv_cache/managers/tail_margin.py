"""The tail margin: how far before a prompt's end a sliding-window group keeps windows.

Prompts usually end in a unique part (a question, a new turn) after the part
later prompts share, and the first request on a prefix cannot know where that
part starts. So a sliding-window group keeps the windows of the stops in the
last `tokens` tokens of a released prompt: a later prompt that branches off
there finds the window it resumes from.

How long those unique tails are is seen on the requests that branch off cached
data: a request's tail is its prompt tokens after its junction. The margin is
the longest tail among the last `history` requests whose tail was at most
`max_tokens`, and `max_tokens` until one has been seen. Branches further back
(a question after a partly evicted document, a new document after a shared
preamble) say nothing about where prompts end and are not counted.

    >>> m = TailMargin(max_tokens=192, history=2)
    >>> m.tokens, m.first_stop(num_prompt_tokens=1088, block_size=128)
    (192, 7)
    >>> m.observe("a", 64)   # a request branched 64 tokens before its prompt end
    >>> m.tokens, m.first_stop(num_prompt_tokens=1088, block_size=128)
    (64, 8)
"""

from __future__ import annotations

from collections import OrderedDict


class TailMargin:
    """The longest recent unique tail within `max_tokens`, learned per group.

    Args:
        max_tokens: the widest margin (and the margin before any tail is seen).
        history: how many of the most recent branching requests count.

    Raises:
        ValueError: naming the argument, for a negative `max_tokens` or a
            `history` under 1.
    """

    def __init__(self, max_tokens: int, history: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"TailMargin max_tokens must be >= 0, got {max_tokens}")
        if history < 1:
            raise ValueError(f"TailMargin history must be >= 1, got {history}")
        self.max_tokens = max_tokens
        self.history = history
        self.tails: OrderedDict[str, int] = OrderedDict()  # request id -> tail, oldest first
        self.tokens = max_tokens

    def counts(self, request_id: str, tail: int) -> bool:
        """Whether observing this tail would change anything: it is within the widest
        margin and not already recorded for the request."""
        return tail <= self.max_tokens and self.tails.get(request_id) != tail

    def observe(self, request_id: str, tail: int) -> None:
        """Record that the request branched off cached data `tail` prompt tokens
        before its prompt end (a tail past `max_tokens` is ignored). Mutates
        `tails` and `tokens`."""
        if not self.counts(request_id, tail):
            return
        tails = self.tails
        tails[request_id] = tail
        tails.move_to_end(request_id)
        if len(tails) > self.history:
            tails.popitem(last=False)
        self.tokens = max(tails.values())

    def first_stop(self, num_prompt_tokens: int, block_size: int) -> int:
        """The first stop (in blocks) whose window is kept: the block boundary at or
        before `num_prompt_tokens - tokens`, so every branch point within the margin
        has its stop kept. Pure."""
        return max(0, num_prompt_tokens - self.tokens) // block_size

    def check_integrity(self) -> None:
        """Assert that the margin is the longest recorded tail, within bounds."""
        tails = self.tails
        assert len(tails) <= self.history, f"{len(tails)} tails kept, history {self.history}"
        assert all(0 <= t <= self.max_tokens for t in tails.values()), f"tail out of range: {tails}"
        expected = max(tails.values()) if tails else self.max_tokens
        assert self.tokens == expected, f"tail margin {self.tokens}, longest tail {expected}"
