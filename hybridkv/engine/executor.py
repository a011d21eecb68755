"""Turns a scheduled step into one model forward over the paged cache.

For every KV cache group it builds the step's metadata from the manager's
block ids: block tables and slot mappings for attention groups, state
instructions (live block, hit source, checkpoints) for Mamba groups. The
runner reads and writes the paged tensors; the executor never touches pool
internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from hybridkv.engine.block_ids import BlockIdCache
from hybridkv.engine.kv_memory import allocate_kv_slots, kv_views
from hybridkv.engine.scheduler import ScheduledSeq
from hybridkv.kernels.attention import AttentionBatch
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.specs import AttentionSpec, MambaSpec
from hybridkv.models.mamba_batch import MambaBatch


class _StepInputs(NamedTuple):
    """What every group's metadata of one step is built from."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    starts: list[int]  # [S + 1] cumulative new tokens
    token_seq: np.ndarray  # int64 [T] batch index of each token
    token_pos: np.ndarray  # int64 [T] position of each token
    query_start_loc: torch.Tensor  # int32 [S + 1]
    seq_lens: torch.Tensor  # int32 [S]
    max_query_len: int
    max_seq_len: int


# Steps of at most this many new tokens (decode batches) of a small model run on one CPU
# thread: their matrix products are too small for a second thread to pay for its start-up and
# join, and on a loaded machine a thread waiting for a busy core stalls the whole step
# (measured: a decode step of 8 sequences of the 4-layer preset took 3.7 ms on one thread and
# 51 ms on two, load 4 on 2 cores; quiet, 1.57 ms on one and 1.65 ms on two).
SMALL_STEP_TOKENS = 64
# A model with at least this many bytes of weights streams them from memory on every decode
# step (more than a last-level cache holds), and a step is then bound by memory bandwidth,
# which a second core adds to: its small steps keep torch's thread count (measured at the
# 270M shape, 384 MiB, 8 sequences, quiet: 47.1 ms on one thread, 34.4 ms on two).
STREAMED_WEIGHT_BYTES = 32 << 20


def small_step_thread_count(model: torch.nn.Module) -> int | None:
    """Threads for a decode-sized step of `model`: one when its weights fit in cache, or
    None (torch's setting) when every step streams them from memory."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return None if size >= STREAMED_WEIGHT_BYTES else 1


class ModelExecutor:
    """Owns the KV memory and runs steps of a model runner.

    Args:
        runner: a `hybridkv.models` runner (forward over flattened batches).
        config: the KV cache layout (from `KVCacheConfig.from_layer_specs`).
        device: where tensors live.
        poison: fill memory with NaN at start-up, and every block with NaN
            again whenever it stops holding valid data (call `poison_blocks`
            from the manager's `on_stale_blocks` hook), so a read of stale or
            unwritten KV shows up as NaN in the output.
        small_step_threads: CPU threads for steps of at most `SMALL_STEP_TOKENS` new
            tokens (larger steps use torch's setting); None: torch's setting for all;
            "auto": `small_step_thread_count` of the runner's model.
    """

    def __init__(self, runner, config: KVCacheConfig, device: str | torch.device = "cpu",
                 poison: bool = False,
                 small_step_threads: int | str | None = "auto") -> None:
        self.runner = runner
        self.config = config
        self.device = torch.device(device)
        self.kv_slots = allocate_kv_slots(config, self.device)  # raw pages, shared by groups
        self.kv_views = kv_views(config, self.kv_slots, fill=float("nan") if poison else None)
        self._zero_mamba_states()
        runner.bind_kv_cache(self.kv_views)
        self.groups = [(i, g.kv_cache_spec, g.layer_names)
                       for i, g in enumerate(config.kv_cache_groups)]
        self.block_ids = BlockIdCache()
        if small_step_threads == "auto":
            small_step_threads = small_step_thread_count(runner.model)
        self.small_step_threads = small_step_threads

    def poison_blocks(self, block_ids: list[int]) -> None:
        """Fill these blocks with NaN in every layer (see `poison` above)."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        for tensors in self.kv_views.values():
            for t in tensors:
                if t.is_floating_point():
                    t.index_fill_(0, index, float("nan"))

    def _zero_mamba_states(self) -> None:
        for group in self.config.kv_cache_groups:
            if isinstance(group.kv_cache_spec, MambaSpec):
                for name in group.layer_names:
                    for t in self.kv_views[name]:
                        t.zero_()

    def execute(self, batch: Sequence[ScheduledSeq], kv: KVCacheManager) -> torch.Tensor:
        """Run one step; return float32 logits [num sampling seqs, vocab] in batch order.

        A step of at most `SMALL_STEP_TOKENS` new tokens on CPU runs on
        `small_step_threads` threads (torch's thread count is restored after).
        """
        threads = self.small_step_threads
        if (threads is None or self.device.type != "cpu"
                or sum(item.num_new for item in batch) > SMALL_STEP_TOKENS):
            return self._execute(batch, kv)
        previous = torch.get_num_threads()
        if previous == threads:
            return self._execute(batch, kv)
        torch.set_num_threads(threads)
        try:
            return self._execute(batch, kv)
        finally:
            torch.set_num_threads(previous)

    @torch.inference_mode()
    def _execute(self, batch: Sequence[ScheduledSeq], kv: KVCacheManager) -> torch.Tensor:
        rows = self.block_ids.block_ids(kv, [item.seq.request_id for item in batch])
        step = self._step_inputs(batch)
        attn, mamba = {}, {}
        plans: dict = {}  # tilings shared by the groups' batches (same starts and lengths)
        for gid, spec, names in self.groups:
            ids = [row[gid] for row in rows]
            if isinstance(spec, AttentionSpec):
                meta = self._attention_batch(step, [g.array for g in ids], spec.block_size,
                                             plans)
                attn.update(dict.fromkeys(names, meta))
            elif isinstance(spec, MambaSpec):
                mb = self._mamba_batch(batch, [g.ids for g in ids], gid, step.starts, kv)
                mamba.update(dict.fromkeys(names, mb))
        logits_indices = torch.tensor([step.starts[i + 1] - 1 for i, item in enumerate(batch)
                                       if item.samples], dtype=torch.long, device=self.device)
        if mamba:
            return self.runner.forward(step.input_ids, step.positions, attn, logits_indices,
                                       mamba_batches=mamba)
        return self.runner.forward(step.input_ids, step.positions, attn, logits_indices)

    def _step_inputs(self, batch: Sequence[ScheduledSeq]) -> _StepInputs:
        """Tokens, positions and per-sequence counts of a step, built once for all groups."""
        tokens: list[int] = []
        for item in batch:
            c = item.num_computed
            tokens.extend(item.seq.request.all_token_ids[c:c + item.num_new])
        num_new = np.array([item.num_new for item in batch], dtype=np.int64)
        computed = np.array([item.num_computed for item in batch], dtype=np.int64)
        starts = np.zeros(len(batch) + 1, dtype=np.int64)
        np.cumsum(num_new, out=starts[1:])
        token_seq = np.repeat(np.arange(len(batch)), num_new)  # [T] sequence of each token
        positions = np.arange(starts[-1]) + (computed - starts[:-1])[token_seq]  # [T]
        seq_lens = computed + num_new
        dev = self.device
        return _StepInputs(
            input_ids=torch.tensor(tokens, dtype=torch.long, device=dev),
            positions=torch.from_numpy(positions).to(dev),
            starts=starts.tolist(),
            token_seq=token_seq,
            token_pos=positions,
            query_start_loc=torch.from_numpy(starts.astype(np.int32)).to(dev),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(dev),
            max_query_len=int(num_new.max()),
            max_seq_len=int(seq_lens.max()),
        )

    def _attention_batch(self, step: _StepInputs, ids: list[np.ndarray], block_size: int,
                         plans: dict) -> AttentionBatch:
        width = max(len(row) for row in ids)
        table = np.zeros((len(ids), width), dtype=np.int32)  # 0: the null block
        for s, row in enumerate(ids):
            table[s, :len(row)] = row
        pos = step.token_pos
        slots = table[step.token_seq, pos // block_size] * np.int64(block_size) + pos % block_size
        dev = self.device
        return AttentionBatch(
            query_start_loc=step.query_start_loc,
            seq_lens=step.seq_lens,
            block_table=torch.from_numpy(table).to(dev),
            slot_mapping=torch.from_numpy(slots).to(dev),
            max_query_len=step.max_query_len,
            max_seq_len=step.max_seq_len,
            plans=plans,
        )

    @staticmethod
    def _mamba_batch(batch: Sequence[ScheduledSeq], ids: list[list[int]], group_id: int,
                     starts: list[int], kv: KVCacheManager) -> MambaBatch:
        plans = [kv.mamba_state_plan(group_id, row, item.num_computed, item.num_new)
                 for item, row in zip(batch, ids)]
        return MambaBatch(
            query_start_loc=list(starts),
            live_blocks=[p.live_block_id for p in plans],
            source_blocks=[p.source_block_id for p in plans],
            has_initial_state=[item.num_computed > 0 for item in batch],
            checkpoints=[p.checkpoints for p in plans],
        )
