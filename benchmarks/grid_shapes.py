"""Workload shapes of vLLM's own benchmark datasets, for the policy grid.

- `rep<P>x<L>s<S>`: vLLM's `prefix_repetition` dataset (`vllm bench serve
  --dataset-name prefix_repetition`): P prefixes of L tokens, each used R = 6
  times, in random order, every prompt a prefix plus a unique suffix of S
  tokens. Every prefix is as popular as every other: an order that ranks by
  past hits has nothing to go on, and LRU is as good as any online order.
- `random`: vLLM's `random` dataset: unique prompts, no reuse at all (nothing
  to gain; a policy must not lose anything either, e.g. by failing to admit).

Tokens come from the seeded draws of `hybridkv.tools.pressure_workloads`, so a
shape is the same on every machine. The number of requests in flight is a grid
dimension of its own (`with_concurrency`).
"""

from __future__ import annotations

import dataclasses
import re

from hybridkv.tools.pressure_workloads import Draws, make_trace
from hybridkv.tools.traces import Trace, TraceRequest

REPEATS = 6
OUTPUT_TOKENS = 64
RANDOM_REQUESTS, RANDOM_PROMPT = 64, 1024
# the prefix_repetition settings on the grid: vLLM's (16 x 1,024, suffix 64) and others
REP_SHAPES = ("rep16x1024s64", "rep8x2048s256", "rep32x512s64", "rep6x4096s512")
VLLM_SHAPES = REP_SHAPES + ("random",)
_REP = re.compile(r"rep(\d+)x(\d+)s(\d+)$")


def prefix_repetition(seed: int, num_prefixes: int, prefix_len: int, suffix_len: int) -> Trace:
    """`num_prefixes` prefixes of `prefix_len` tokens, each used REPEATS times in random
    order, each prompt ending in its own `suffix_len` tokens."""
    name = f"rep{num_prefixes}x{prefix_len}s{suffix_len}"
    d = Draws(name, seed)
    prefixes = [d.tokens(f"p{k}", prefix_len) for k in range(num_prefixes)]
    order = [k for k in range(num_prefixes) for _ in range(REPEATS)]
    d.shuffle(order)
    reqs = [TraceRequest(f"p{k}-q{i}", tuple(prefixes[k] + d.tokens(f"q{i}", suffix_len)),
                         tuple(d.tokens(f"a{i}", OUTPUT_TOKENS)))
            for i, k in enumerate(order)]
    return Trace(name, seed, tuple(reqs), 4,
                 dict(prefixes=num_prefixes, prefix_len=prefix_len, suffix_len=suffix_len,
                      repeats=REPEATS))


def random_prompts(seed: int) -> Trace:
    """Unique prompts of RANDOM_PROMPT tokens: no prefix is ever reused."""
    d = Draws("random", seed)
    reqs = [TraceRequest(f"r{i}", tuple(d.tokens(f"r{i}", RANDOM_PROMPT)),
                         tuple(d.tokens(f"a{i}", OUTPUT_TOKENS))) for i in range(RANDOM_REQUESTS)]
    return Trace("random", seed, tuple(reqs), 4, dict(prompt_len=RANDOM_PROMPT))


def grid_trace(shape: str, seed: int) -> Trace:
    """A pressure workload (`make_trace`) or one of this module's shapes."""
    if shape == "random":
        return random_prompts(seed)
    match = _REP.match(shape)
    if match:
        p, length, s = map(int, match.groups())
        return prefix_repetition(seed, p, length, s)
    return make_trace(shape, seed)


def with_concurrency(trace: Trace, max_running: int) -> Trace:
    """The same requests with `max_running` in flight (0: the trace's own)."""
    return trace if max_running <= 0 else dataclasses.replace(trace, max_running=max_running)
