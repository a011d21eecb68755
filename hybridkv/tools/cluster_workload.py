"""Requests arriving in time at a cluster: documents, few-shot headers, chats.

Three kinds of traffic share the cluster, all deterministic for a seed:

- document QA: a long document (Zipf popularity: a few are asked about
  often) followed by a unique question;
- few-shot: one of a few example headers followed by a question;
- multi-turn chat: sessions under a handful of shared system prompts; each
  turn re-sends the conversation so far (with the model's answers) plus a
  new message, a think time after the previous answer.

Documents, headers and chat sessions scale with the number of instances, so
the working set outgrows one instance's pool while the cluster's pools
together can hold it. Open-loop arrivals (documents, few-shot, first turns)
are a Poisson process; later turns follow their session's answers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Session:
    """A chat: its conversation so far, how many turns are left, and its own
    random stream (so its turns do not depend on the order events run in)."""

    history: list[int]
    turns_left: int
    rng: random.Random


@dataclass
class Arrival:
    time: float
    kind: str  # "doc", "fewshot" or "chat"
    prompt: list[int]
    max_tokens: int
    session: Session | None = None


@dataclass
class WorkloadShape:
    """Sizes in tokens; counts per instance of the cluster."""

    docs_per_instance: float = 3.0
    doc_len: tuple[int, int] = (1024, 4096)
    doc_zipf: float = 0.9
    question_len: tuple[int, int] = (24, 96)
    headers_per_instance: float = 0.5
    header_len: tuple[int, int] = (768, 2048)
    sessions_per_instance: float = 2.0
    system_prompts: int = 4
    system_len: tuple[int, int] = (256, 768)
    first_user_len: tuple[int, int] = (128, 768)
    user_len: tuple[int, int] = (32, 160)
    turns: tuple[int, int] = (3, 6)
    think_time_s: float = 20.0
    output_len: tuple[int, int] = (16, 48)
    mix: tuple[float, float, float] = (0.5, 0.2, 0.3)  # doc, few-shot, chat (session starts)
    vocab: int = 32000


@dataclass
class ClusterWorkload:
    """Arrivals for `num_instances` instances at `rate_per_instance` open-loop
    requests per second each, `requests_per_instance` open-loop requests each."""

    num_instances: int
    rate_per_instance: float
    requests_per_instance: int
    seed: int = 0
    shape: WorkloadShape = field(default_factory=WorkloadShape)

    def __post_init__(self) -> None:
        for name in ("num_instances", "requests_per_instance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not self.rate_per_instance > 0:
            raise ValueError(f"rate_per_instance must be > 0, got {self.rate_per_instance!r}")
        self.rng = random.Random(self.seed)
        s, n = self.shape, self.num_instances
        self.docs = [self._tokens(s.doc_len) for _ in range(max(1, round(s.docs_per_instance * n)))]
        self.doc_weights = [1 / (r + 1) ** s.doc_zipf for r in range(len(self.docs))]
        self.headers = [self._tokens(s.header_len)
                        for _ in range(max(1, round(s.headers_per_instance * n)))]
        self.systems = [self._tokens(s.system_len) for _ in range(s.system_prompts)]

    def _tokens(self, bounds: tuple[int, int], rng: random.Random | None = None) -> list[int]:
        rng = rng or self.rng
        getrandbits, vocab = rng.getrandbits, self.shape.vocab - 3
        return [3 + getrandbits(24) % vocab for _ in range(rng.randint(*bounds))]  # 0-2: special

    def _output_len(self, rng: random.Random | None = None) -> int:
        return (rng or self.rng).randint(*self.shape.output_len)

    def open_arrivals(self) -> list[Arrival]:
        """Documents, few-shot questions and first chat turns, in time order."""
        rng, s = self.rng, self.shape
        rate = self.rate_per_instance * self.num_instances
        total = self.requests_per_instance * self.num_instances
        out, now = [], 0.0
        for _ in range(total):
            now += rng.expovariate(rate)
            kind = rng.choices(("doc", "fewshot", "chat"), s.mix)[0]
            out.append(self._open_arrival(now, kind))
        return out

    def _open_arrival(self, now: float, kind: str) -> Arrival:
        s, rng = self.shape, self.rng
        if kind == "doc":
            doc = rng.choices(self.docs, self.doc_weights)[0]
            return Arrival(now, kind, doc + self._tokens(s.question_len), self._output_len())
        if kind == "fewshot":
            header = rng.choice(self.headers)
            return Arrival(now, kind, header + self._tokens(s.question_len), self._output_len())
        session = Session(rng.choice(self.systems)[:], rng.randint(*s.turns),
                          random.Random(rng.getrandbits(64)))
        return self._turn(now, session, s.first_user_len)

    def _turn(self, now: float, session: Session, user_len: tuple[int, int]) -> Arrival:
        session.turns_left -= 1
        prompt = session.history + self._tokens(user_len, session.rng)
        return Arrival(now, "chat", prompt, self._output_len(session.rng), session)

    def next_turn(self, arrival: Arrival, output: list[int], now: float) -> Arrival | None:
        """The session's next turn after `arrival` was answered with `output` at `now`."""
        session = arrival.session
        if session is None or session.turns_left <= 0:
            return None
        session.history = arrival.prompt + output
        think = session.rng.expovariate(1 / self.shape.think_time_s)
        return self._turn(now + think, session, self.shape.user_len)

    def max_prompt_tokens(self) -> int:
        """An upper bound on any prompt plus its output (pools must hold one)."""
        s = self.shape
        longest_chat = (s.system_len[1] + s.first_user_len[1]
                        + (s.turns[1] - 1) * (s.user_len[1] + s.output_len[1]) + s.output_len[1])
        return max(s.doc_len[1] + s.question_len[1], s.header_len[1] + s.question_len[1],
                   longest_chat) + s.output_len[1]
