"""Per-step state instructions for the Mamba layers of one KV cache group."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MambaBatch:
    """Where each sequence of a step reads and writes its recurrent state.

    Sequence s owns rows `query_start_loc[s]:query_start_loc[s + 1]` of the
    flattened batch. Its initial state (conv and SSM) is read from
    `source_blocks[s]` when set (a prefix-cache hit), else from
    `live_blocks[s]` when `has_initial_state[s]`, else it is zero. After
    `k` of its new tokens, for each `(k, block_id)` in `checkpoints[s]`, the
    state is written to `block_id`; the final state goes to `live_blocks[s]`.

    Sequences must be processed in batch order within a layer: a later
    sequence may read as its source a checkpoint an earlier one writes in the
    same step.
    """

    query_start_loc: list[int]
    live_blocks: list[int]
    source_blocks: list[int | None]
    has_initial_state: list[bool]
    checkpoints: list[list[tuple[int, int]]]

    @property
    def num_seqs(self) -> int:
        return len(self.live_blocks)
