"""Workload generators shared by the demo and the simulator.

Every generator is deterministic for a seed and returns plain token-id
lists, so the same workload can run through the engine (`LLM.generate`) or
through the bookkeeping alone (`hybridkv.tools.simulate`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

# turns of a chat: (request prompts of this turn) -> outputs, one per prompt
GenerateFn = Callable[[list[list[int]]], list[list[int]]]


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]  # ids 0-2 are special in the presets


def shared_documents(num_docs: int = 3, doc_len: int = 384, questions_per_doc: int = 4,
                     question_len: int = 24, vocab: int = 512, seed: int = 0) -> list[list[int]]:
    """RAG: every prompt is one of a few documents plus a unique question,
    questions of different documents interleaved."""
    rng = random.Random(seed)
    docs = [_tokens(rng, doc_len, vocab) for _ in range(num_docs)]
    return [docs[d] + _tokens(rng, question_len, vocab)
            for _ in range(questions_per_doc) for d in range(num_docs)]


def few_shot(header_len: int = 320, num_questions: int = 8, question_len: int = 24,
             vocab: int = 512, seed: int = 0) -> list[list[int]]:
    """Few-shot prompting: one long header of examples shared by every question."""
    rng = random.Random(seed)
    header = _tokens(rng, header_len, vocab)
    return [header + _tokens(rng, question_len, vocab) for _ in range(num_questions)]


@dataclass
class ChatWorkload:
    """Multi-turn chat: each turn re-sends the conversation so far plus a new message."""

    num_sessions: int = 3
    num_turns: int = 3
    system_len: int = 64
    user_len: int = 48
    vocab: int = 512
    seed: int = 0
    histories: list[list[int]] = field(default_factory=list)

    def run(self, generate: GenerateFn) -> list[list[int]]:
        """Play every turn through `generate`; return all outputs in order."""
        rng = random.Random(self.seed)
        system = _tokens(rng, self.system_len, self.vocab)
        self.histories = [list(system) for _ in range(self.num_sessions)]
        outputs: list[list[int]] = []
        for _ in range(self.num_turns):
            prompts = [h + _tokens(rng, self.user_len, self.vocab) for h in self.histories]
            turn_outputs = generate(prompts)
            self.histories = [p + out for p, out in zip(prompts, turn_outputs)]
            outputs.extend(turn_outputs)
        return outputs


BUILTIN_TRACES = ("shared-documents", "few-shot", "multi-turn")
