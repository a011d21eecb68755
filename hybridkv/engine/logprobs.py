"""Logprobs of sampled and prompt tokens, from the RAW model logits.

As vLLM's default `logprobs_mode="raw_logprobs"`: log_softmax of the model's
logits before penalties, bias and temperature. A token's rank counts the
tokens at least as likely as it (itself included), so the argmax has rank 1.

Prompt logprobs need the logits of prompt positions that sample nothing:
the logits at position p give the logprobs of prompt token p + 1. A step
asks the model for those rows beside its sampling rows (`forward_with_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from hybridkv.engine.sampling import TokenLogprobs
from hybridkv.engine.scheduler import ScheduledSeq, SeqState


def token_logprobs(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprobs:
    """The logprob and rank of `token_id` under `logits` [vocab] and the `k`
    most likely tokens, e.g. TokenLogprobs(7, -0.2, 1, ((7, -0.2), (3, -2.1)))."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [vocab]
    chosen = logprobs[token_id]
    rank = int((logprobs >= chosen).sum().item())
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        values, ids = torch.topk(logprobs, min(k, logprobs.numel()))
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprobs(token_id, float(chosen.item()), rank, top)


class PromptRows(NamedTuple):
    """Rows of one request whose logits give its next prompt logprobs."""

    seq: SeqState
    flat_indices: list[int]  # token rows of the step's flattened batch
    first_token: int  # the prompt token the first row predicts


def prompt_rows(batch: Sequence[ScheduledSeq]) -> list[PromptRows]:
    """Which rows of this step feed prompt logprobs still missing.

    A request asking for them gets `prompt_logprobs = [None]` (the first
    prompt token has none) when first seen. Rows of positions whose entry is
    already filled (a recompute after preemption) are not asked again.
    """
    found: list[PromptRows] = []
    start = 0
    for item in batch:
        seq = item.seq
        if seq.params.prompt_logprobs is not None:
            if seq.prompt_logprobs is None:
                seq.prompt_logprobs = [None]
            first = max(item.num_computed, len(seq.prompt_logprobs) - 1)  # first position
            stop = min(item.num_computed + item.num_new, seq.request.num_prompt_tokens - 1)
            if first < stop:
                rows = [start + p - item.num_computed for p in range(first, stop)]
                found.append(PromptRows(seq, rows, first + 1))
        start += item.num_new
    return found


def add_prompt_logprobs(rows: PromptRows, logits: torch.Tensor) -> None:
    """Append the entries `logits` [len(rows.flat_indices), vocab] give to
    `rows.seq.prompt_logprobs`."""
    seq = rows.seq
    assert seq.prompt_logprobs is not None and len(seq.prompt_logprobs) == rows.first_token, \
        f"{seq.request_id}: prompt logprobs out of order"
    k = seq.params.prompt_logprobs
    assert k is not None
    prompt = seq.request.prompt_token_ids
    for i in range(logits.shape[0]):
        token = prompt[rows.first_token + i]
        seq.prompt_logprobs.append(token_logprobs(logits[i], token, k))


class _RowTap:
    """A runner whose `forward` also computes the logits of `extra` token rows
    (kept in `extra_logits`) and returns only the rows it was asked for."""

    def __init__(self, runner: Any, extra: list[int]) -> None:
        self.runner = runner
        self.extra = extra
        self.extra_logits: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_batches: Any,
                logits_indices: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        extra = torch.tensor(self.extra, dtype=logits_indices.dtype,
                             device=logits_indices.device)
        both = torch.cat([logits_indices, extra])
        logits = self.runner.forward(input_ids, positions, attn_batches, both, **kwargs)
        num = logits_indices.numel()
        self.extra_logits = logits[num:]  # [len(extra), vocab]
        return logits[:num]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


@contextmanager
def forward_with_rows(executor: Any, extra: list[int]) -> Iterator[_RowTap]:
    """While open, `executor`'s model forwards also compute the logits of the
    flattened token rows `extra`; read them from the yielded tap's
    `extra_logits` after `executor.execute`."""
    tap = _RowTap(executor.runner, extra)
    executor.runner = tap
    try:
        yield tap
    finally:
        executor.runner = tap.runner
