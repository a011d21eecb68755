"""Workloads that put a prefix cache under memory pressure, generated from a seed.

Five shapes, each a family rather than one trace: the seed draws the shape's
parameters (session counts, document lengths, header tree, ...) from ranges
as well as the tokens, so a policy judged on several seeds is judged on the
family. Every trace is a `hybridkv.tools.traces.Trace`: requests in arrival
order plus the number of requests a scheduler should run at once.

- `multi_turn`: chat sessions visited round-robin; each turn re-sends the
  session so far (earlier prompts and outputs) plus a new message.
- `fewshot`: a tree of few-shot headers (system prompt, task families,
  variants) shared by questions with Zipf-like popularity unrelated to length.
- `long_doc`: a few long documents behind a preamble, each asked many
  questions in random order.
- `agent_loop`: agents whose context grows by their actions and tool outputs
  behind a shared system and tool header; a few run round-robin, and a
  finished agent's slot goes to a new one (its context is dead weight).
- `hot_cold`: retrieval over a few hot documents asked often and many cold
  ones asked once or twice (a scan that must not flush the hot ones).

Tokens come from SHAKE-128 of a key, so traces are the same on every Python
version and machine.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable

from hybridkv.tools.traces import Trace, TraceRequest

VOCAB = 32000


class Draws:
    """Deterministic draws for one trace: integers from a counter-mode SHAKE
    stream, token runs from their own keys."""

    def __init__(self, name: str, seed: int) -> None:
        self._key = f"{name}/{seed}"
        self._counter = 0

    def _u64(self) -> int:
        self._counter += 1
        digest = hashlib.shake_128(f"{self._key}#{self._counter}".encode()).digest(8)
        return int.from_bytes(digest, "little")

    def int(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi]."""
        return lo + self._u64() % (hi - lo + 1)

    def chance(self, p: float) -> bool:
        return self._u64() < p * 2.0**64

    def pick(self, weights: list[float]) -> int:
        """An index drawn with probability proportional to `weights`."""
        x = self._u64() / 2.0**64 * sum(weights)
        for i, w in enumerate(weights):
            x -= w
            if x < 0:
                return i
        return len(weights) - 1

    def shuffle(self, items: list) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self._u64() % (i + 1)
            items[i], items[j] = items[j], items[i]

    def tokens(self, tag: str, n: int) -> list[int]:
        """`n` token ids for the run named `tag` (the same tag gives the same run)."""
        raw = hashlib.shake_128(f"{self._key}:{tag}".encode()).digest(4 * n)
        return [t % VOCAB for t in array("I", raw)]


def _zipf(n: int, s: float = 0.8) -> list[float]:
    return [1.0 / (rank + 1) ** s for rank in range(n)]


def multi_turn(seed: int) -> Trace:
    """Sessions visited round-robin, every turn the whole session so far plus a new message."""
    d = Draws("multi_turn", seed)
    sessions, turns = d.int(10, 20), d.int(4, 6)
    system = d.tokens("system", d.int(256, 768))
    first, later = (d.int(384, 1024), d.int(1536, 3072)), (d.int(48, 128), d.int(256, 640))
    by_session = []
    for s in range(sessions):
        context, session = list(system), []
        for t in range(turns):
            span = first if t == 0 else later
            prompt = context + d.tokens(f"u{s}.{t}", d.int(*span))
            output = d.tokens(f"o{s}.{t}", d.int(8, 32))
            session.append(TraceRequest(f"s{s}-t{t}", tuple(prompt), tuple(output)))
            context = prompt + output
        by_session.append(session)
    reqs = [by_session[s][t] for t in range(turns) for s in range(sessions)]
    return Trace("multi_turn", seed, tuple(reqs), 4,
                 dict(sessions=sessions, turns=turns, system=len(system)))


def fewshot(seed: int) -> Trace:
    """System prompt -> task families -> variants: a header tree shared by questions."""
    d = Draws("fewshot", seed)
    system = d.tokens("system", d.int(192, 512))
    headers = []
    for f in range(d.int(3, 5)):
        family = system + d.tokens(f"f{f}", d.int(100, 3000))
        for v in range(d.int(2, 3)):
            headers.append(family + d.tokens(f"f{f}.v{v}", d.int(150, 6000)))
    weights = _zipf(len(headers))
    d.shuffle(weights)  # popularity unrelated to length
    reqs = []
    for i in range(d.int(200, 300)):
        h = d.pick(weights)
        prompt = headers[h] + d.tokens(f"q{i}", d.int(24, 200))
        reqs.append(TraceRequest(f"h{h}-q{i}", tuple(prompt), tuple(d.tokens(f"a{i}",
                                                                             d.int(8, 32)))))
    return Trace("fewshot", seed, tuple(reqs), 12,
                 dict(headers=[len(h) for h in headers]))


def long_doc(seed: int) -> Trace:
    """A preamble and a few long documents, each asked many questions, interleaved."""
    d = Draws("long_doc", seed)
    preamble = d.tokens("preamble", d.int(128, 512))
    docs = [preamble + d.tokens(f"d{k}", d.int(4000, 24000)) for k in range(d.int(3, 6))]
    per_doc = d.int(8, 16)
    order = [k for k in range(len(docs)) for _ in range(per_doc)]
    d.shuffle(order)
    reqs = []
    for i, k in enumerate(order):
        prompt = docs[k] + d.tokens(f"q{i}", d.int(32, 160))
        reqs.append(TraceRequest(f"d{k}-q{i}", tuple(prompt),
                                 tuple(d.tokens(f"a{i}", d.int(8, 32)))))
    return Trace("long_doc", seed, tuple(reqs), 4,
                 dict(docs=[len(x) for x in docs], questions_per_doc=per_doc))


def agent_loop(seed: int) -> Trace:
    """Agents behind a shared system and tool header, a few at a time round-robin.

    Step k of an agent: the header, its task, then every earlier action (the
    step's output) and tool result, then the newest tool result. When an
    agent is done a new one takes its slot; the finished context is never
    asked again.
    """
    d = Draws("agent_loop", seed)
    header = d.tokens("header", d.int(1024, 3072))
    slots, total = d.int(4, 7), d.int(12, 24)
    agents = []  # each: list of requests in step order
    for a in range(total):
        context = header + d.tokens(f"task{a}", d.int(64, 512))
        steps = []
        for k in range(d.int(4, 10)):
            big = d.chance(0.25)  # a file or page dump, else a short tool answer
            tool = d.tokens(f"tool{a}.{k}", d.int(600, 2000) if big else d.int(32, 300))
            prompt = context + tool
            action = d.tokens(f"act{a}.{k}", d.int(16, 48))
            steps.append(TraceRequest(f"a{a}-k{k}", tuple(prompt), tuple(action)))
            context = prompt + action
        agents.append(steps)
    running = list(range(slots))  # agent index per slot
    pending, progress, reqs = slots, [0] * total, []
    while any(a is not None for a in running):
        for s, a in enumerate(running):
            if a is None:
                continue
            reqs.append(agents[a][progress[a]])
            progress[a] += 1
            if progress[a] == len(agents[a]):
                running[s] = pending if pending < total else None
                pending += 1
    return Trace("agent_loop", seed, tuple(reqs), 3,
                 dict(header=len(header), slots=slots, agents=total))


def hot_cold(seed: int) -> Trace:
    """Retrieval: a question over one document, a few hot documents asked often
    (Zipf) among many cold ones asked once or twice."""
    d = Draws("hot_cold", seed)
    system = d.tokens("system", d.int(128, 512))
    num_hot = d.int(3, 6)
    hot = [system + d.tokens(f"hot{k}", d.int(1500, 6000)) for k in range(num_hot)]
    p_hot, weights = d.int(40, 70) / 100, _zipf(num_hot)
    cold: list[list[int]] = []
    reqs = []
    for i in range(d.int(200, 300)):
        if d.chance(p_hot):
            k = d.pick(weights)
            doc, tag = hot[k], f"h{k}"
        elif cold and d.chance(0.2):  # a cold document asked again soon
            k = len(cold) - 1 - d.int(0, min(4, len(cold) - 1))
            doc, tag = cold[k], f"c{k}"
        else:
            cold.append(system + d.tokens(f"cold{len(cold)}", d.int(1500, 6000)))
            doc, tag = cold[-1], f"c{len(cold) - 1}"
        prompt = doc + d.tokens(f"q{i}", d.int(24, 128))
        reqs.append(TraceRequest(f"{tag}-q{i}", tuple(prompt),
                                 tuple(d.tokens(f"a{i}", d.int(8, 32)))))
    return Trace("hot_cold", seed, tuple(reqs), 8,
                 dict(hot=[len(x) for x in hot], p_hot=p_hot, cold=len(cold)))


WORKLOADS: dict[str, Callable[[int], Trace]] = {
    "multi_turn": multi_turn,
    "fewshot": fewshot,
    "long_doc": long_doc,
    "agent_loop": agent_loop,
    "hot_cold": hot_cold,
}


def make_trace(shape: str, seed: int) -> Trace:
    """The trace of `shape` for `seed`; ValueError naming an unknown shape."""
    if shape not in WORKLOADS:
        raise ValueError(f"unknown workload shape {shape!r}; use one of {sorted(WORKLOADS)}")
    return WORKLOADS[shape](seed)
