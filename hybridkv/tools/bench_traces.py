"""Fixed-parameter traces of the benchmarks: one function per workload shape.

Each generator returns a `hybridkv.tools.traces.Trace` whose parameters are
the function's arguments (the seeded families of the policy grid, which draw
their parameters from the seed, are `hybridkv.tools.pressure_workloads`).
Tokens come from `TokenStream`, built on `random.Random.random()` (the one
method whose sequence Python keeps stable across versions) seeded from a
path of integers, so every part of a trace has its own stream: request i
is the same whatever the number of requests, and a trace is the same on
every machine (`Trace.fingerprint()` checks it).

- `shared_prefix_trace`: one (or a few) shared system prompts + a unique
  suffix + decode steps; the scheduler-path replay. Nothing is evicted with
  the default pool.
- `multi_turn_round_robin`: chats visited round-robin; each turn re-sends
  the whole conversation so far (outputs included) plus a new message.
- `branching_fewshot`: a tree of few-shot headers (system prompt, task
  families, variants) shared by many questions, Zipf-like popularity.
- `long_doc_qa`: a few long documents behind a shared preamble, many
  questions each, interleaved.

The last three are built to be replayed under memory pressure (see
`hybridkv.tools.pressure`); `hybridkv.tools.traces.reuse_stats` gives the
working set a pool competes for and the hit-rate ceiling of an infinite pool.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Sequence

from hybridkv.tools.traces import Trace, TraceRequest

VOCAB = 32000


class TokenStream:
    """Deterministic token ids for one path of integers, e.g. (seed, trace, request)."""

    def __init__(self, *path: int) -> None:
        key = hashlib.sha256(b"hybridkv-bench" + struct.pack(f"<{len(path)}q", *path)).digest()
        self._rng = random.Random(int.from_bytes(key[:8], "little"))

    def tokens(self, n: int, vocab: int = VOCAB) -> list[int]:
        rnd = self._rng.random
        return [int(rnd() * vocab) for _ in range(n)]

    def integer(self, low: int, high: int) -> int:
        """A whole number in [low, high]."""
        return low + int(self._rng.random() * (high - low + 1))

    def shuffle(self, items: list) -> None:
        """Fisher-Yates on `random()` alone (portable, unlike random.shuffle)."""
        for i in range(len(items) - 1, 0, -1):
            j = int(self._rng.random() * (i + 1))
            items[i], items[j] = items[j], items[i]

    def choice_index(self, cumulative: Sequence[float]) -> int:
        """Index drawn with probabilities given by a cumulative weight list."""
        x = self._rng.random() * cumulative[-1]
        return next(i for i, c in enumerate(cumulative) if x < c)


# stream ids: (seed, SHAPE, ...) keeps the shapes' streams apart
_SHARED, _CHAT, _FEWSHOT, _DOCS = 1, 2, 3, 4


def shared_prefix_trace(num_requests: int = 2000, prefix_len: int = 1024, unique_len: int = 256,
                        decode_steps: int = 64, num_prefixes: int = 1, vocab: int = VOCAB,
                        seed: int = 0) -> Trace:
    """Request i = shared prompt i % num_prefixes + unique suffix, then decode_steps tokens."""
    prefixes = [TokenStream(seed, _SHARED, 0, p).tokens(prefix_len, vocab)
                for p in range(num_prefixes)]
    requests = []
    for i in range(num_requests):
        stream = TokenStream(seed, _SHARED, 1, i)
        prompt = prefixes[i % num_prefixes] + stream.tokens(unique_len, vocab)
        requests.append(TraceRequest(f"req-{i}", tuple(prompt),
                                     tuple(stream.tokens(decode_steps, vocab))))
    params = dict(prefix_len=prefix_len, unique_len=unique_len, decode_steps=decode_steps,
                  num_prefixes=num_prefixes)
    return Trace("shared_prefix", seed, tuple(requests), params=params)


def multi_turn_round_robin(num_sessions: int = 32, num_turns: int = 7, system_len: int = 384,
                           first_message: tuple[int, int] = (768, 2560),
                           message: tuple[int, int] = (96, 640),
                           decode: tuple[int, int] = (8, 32), vocab: int = VOCAB,
                           seed: int = 1) -> Trace:
    """Round-robin chats: turn t of every session before turn t + 1 of any.

    A turn's prompt is the session's history (shared system prompt, every
    earlier message and every earlier output) plus a new message: the first
    one long (a pasted document), later ones shorter (sizes drawn from the
    ranges). The previous turn's whole sequence is a prefix of the next, and
    a turn waits until the previous one has finished (`after`).
    """
    system = TokenStream(seed, _CHAT, 0).tokens(system_len, vocab)
    turns: list[list[TraceRequest]] = [[] for _ in range(num_turns)]
    for s in range(num_sessions):
        history = list(system)
        for t in range(num_turns):
            stream = TokenStream(seed, _CHAT, 1, s, t)
            size = first_message if t == 0 else message
            prompt = history + stream.tokens(stream.integer(*size), vocab)
            output = stream.tokens(stream.integer(*decode), vocab)
            after = f"chat{s}-turn{t - 1}" if t else None
            turns[t].append(TraceRequest(f"chat{s}-turn{t}", tuple(prompt), tuple(output),
                                         after))
            history = prompt + output
    params = dict(num_sessions=num_sessions, num_turns=num_turns, system_len=system_len,
                  first_message=list(first_message), message=list(message),
                  decode=list(decode))
    return Trace("multi_turn_round_robin", seed, tuple(r for turn in turns for r in turn),
                 params=params)


# (family prefix length, variant lengths): below a 296-token system prompt, headers of
# 616 to 9,383 tokens, two of them shorter than a 1,024-token window; no header or
# junction length is a multiple of 16
FEWSHOT_TREE = ((150, (170, 505)), (410, (395, 1030, 2250)), (1350, (935, 3655)),
                (2950, (630, 6137)))


def branching_fewshot(num_requests: int = 360, system_len: int = 296,
                      tree: Sequence[tuple[int, Sequence[int]]] = FEWSHOT_TREE,
                      zipf: float = 0.8, question: tuple[int, int] = (24, 200),
                      decode: tuple[int, int] = (8, 32), vocab: int = VOCAB,
                      seed: int = 2) -> Trace:
    """Prompt = system prompt + family examples + variant examples + a unique question.

    Each question picks a header with probability proportional to
    1 / rank**zipf over a fixed random ranking (popularity is not tied to
    length), so popular headers recur within a few requests and rare ones
    after long gaps. Headers diverge mid-block and at two depths.
    """
    system = TokenStream(seed, _FEWSHOT, 0).tokens(system_len, vocab)
    headers = []
    for f, (family_len, variants) in enumerate(tree):
        family = TokenStream(seed, _FEWSHOT, 1, f).tokens(family_len, vocab)
        headers += [system + family + TokenStream(seed, _FEWSHOT, 2, f, v).tokens(n, vocab)
                    for v, n in enumerate(variants)]
    ranking = list(range(len(headers)))
    TokenStream(seed, _FEWSHOT, 3).shuffle(ranking)
    weights = [0.0] * len(headers)
    for rank, h in enumerate(ranking):
        weights[h] = 1.0 / (rank + 1) ** zipf
    cumulative = [sum(weights[:i + 1]) for i in range(len(weights))]
    picks = TokenStream(seed, _FEWSHOT, 4)
    requests = []
    for i in range(num_requests):
        h = picks.choice_index(cumulative)
        stream = TokenStream(seed, _FEWSHOT, 5, i)
        prompt = headers[h] + stream.tokens(stream.integer(*question), vocab)
        output = stream.tokens(stream.integer(*decode), vocab)
        requests.append(TraceRequest(f"header{h}-q{i}", tuple(prompt), tuple(output)))
    params = dict(num_requests=num_requests, system_len=system_len,
                  header_lens=[len(h) for h in headers], zipf=zipf, question=list(question),
                  decode=list(decode))
    return Trace("branching_fewshot", seed, tuple(requests), params=params)


def long_doc_qa(doc_lens: Sequence[int] = (12500, 17000, 23500, 28500, 34000),
                questions_per_doc: int = 18, preamble_len: int = 256,
                question: tuple[int, int] = (32, 160), decode: tuple[int, int] = (8, 32),
                vocab: int = VOCAB, seed: int = 3) -> Trace:
    """Prompt = shared preamble + document d + a unique question, documents interleaved."""
    preamble = TokenStream(seed, _DOCS, 0).tokens(preamble_len, vocab)
    docs = [preamble + TokenStream(seed, _DOCS, 1, d).tokens(n, vocab)
            for d, n in enumerate(doc_lens)]
    order = [d for d in range(len(docs)) for _ in range(questions_per_doc)]
    TokenStream(seed, _DOCS, 2).shuffle(order)
    asked = [0] * len(docs)
    requests = []
    for d in order:
        stream = TokenStream(seed, _DOCS, 3, d, asked[d])
        prompt = docs[d] + stream.tokens(stream.integer(*question), vocab)
        output = stream.tokens(stream.integer(*decode), vocab)
        requests.append(TraceRequest(f"doc{d}-q{asked[d]}", tuple(prompt), tuple(output)))
        asked[d] += 1
    params = dict(doc_lens=list(doc_lens), questions_per_doc=questions_per_doc,
                  preamble_len=preamble_len, question=list(question), decode=list(decode))
    return Trace("long_doc_qa", seed, tuple(requests), params=params)
