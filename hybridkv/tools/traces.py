"""Token traces: what every replay benchmark and the policy grid feed the driver.

A `Trace` is requests in arrival order, each a prompt and the tokens
appended one per decode step (what a model would sample), plus the number
of requests a scheduler should run at once and the parameters that built
it. Two families build traces: fixed-parameter traces
(`hybridkv.tools.bench_traces`: the scheduler-path replay and the pressure
settings) and seeded shape families (`hybridkv.tools.pressure_workloads`:
the policy grid). `reuse_stats` gives the working set a pool competes for
and the hit rate of an infinite pool.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from dataclasses import dataclass, field
from typing import Any

from hybridkv.tools.ideal import PrefixIndex, reusable_blocks, reuse_ceiling


@dataclass(frozen=True)
class TraceRequest:
    """A prompt, the tokens decoded after it, and the request it must wait for, if
    any (a chat turn is sent once the previous turn's answer is complete)."""

    request_id: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    after: str | None = None


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order, the scheduler's cap on running requests, and the
    parameters that built the trace (for a seeded family: the ones the seed drew)."""

    name: str
    seed: int
    requests: tuple[TraceRequest, ...]
    max_running: int = 4
    params: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """sha256 over every request's id, tokens and dependency (16 hex digits): equal
        fingerprints, equal traces, on every machine."""
        h = hashlib.sha256()
        for r in self.requests:
            h.update(r.request_id.encode())
            h.update(struct.pack("<II", len(r.prompt), len(r.output)))
            h.update(array("I", r.prompt).tobytes())
            h.update(array("I", r.output).tobytes())
            if r.after is not None:
                h.update(b"after:" + r.after.encode())
        return h.hexdigest()[:16]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(r.prompt) for r in self.requests)

    def summary(self) -> dict[str, Any]:
        """Name, fingerprint, counts and parameters (for a benchmark's JSON)."""
        return {"name": self.name, "seed": self.seed, "fingerprint": self.fingerprint(),
                "requests": len(self.requests), "prompt_tokens": self.num_prompt_tokens,
                "decode_tokens": sum(len(r.output) for r in self.requests), **self.params}


@dataclass(frozen=True)
class ReuseStats:
    """What an infinite pool would reuse on a trace (full-attention blocks)."""

    reusable_blocks: int  # distinct blocks some later request's hit covers
    ceiling_hit_rate: float  # hit tokens / prompt tokens with every block kept
    max_request_blocks: int  # blocks of the longest request (prompt + decode)


def reuse_stats(trace: Trace, block_size: int = 16) -> ReuseStats:
    """The working set and hit-rate ceiling of `trace` (`hybridkv.tools.ideal.PrefixIndex`:
    a request's hit is the longest run of its leading blocks that earlier requests,
    prompts and outputs, produced, capped below its last prompt token)."""
    index = PrefixIndex(trace.requests, block_size)
    longest = max((len(r.prompt) + len(r.output) for r in trace.requests), default=0)
    return ReuseStats(reusable_blocks(index), reuse_ceiling(index), -(-longest // block_size))
