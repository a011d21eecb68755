"""Turns a scheduled step into one model forward over the paged cache.

For every KV cache group it builds the step's metadata from the manager's
block ids: block tables and slot mappings for attention groups, state
instructions (live block, hit source, checkpoints) for Mamba groups. The
runner reads and writes the paged tensors; the executor never touches pool
internals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hybridkv.core.kv_cache_config import KVCacheConfig
from hybridkv.core.specs import AttentionSpec, MambaSpec
from hybridkv.engine.kv_memory import allocate_kv_memory
from hybridkv.engine.scheduler import ScheduledSeq
from hybridkv.kernels.attention import AttentionBatch
from hybridkv.kv_cache_manager import KVCacheManager
from hybridkv.managers.mamba import mamba_state_plan
from hybridkv.models.mamba_batch import MambaBatch


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
    """

    def __init__(self, runner, config: KVCacheConfig, device: str | torch.device = "cpu",
                 poison: bool = False) -> None:
        self.runner = runner
        self.config = config
        self.device = torch.device(device)
        self.kv_views = allocate_kv_memory(config, self.device,
                                           fill=float("nan") if poison else None)
        self._zero_mamba_states()
        runner.bind_kv_cache(self.kv_views)
        self.groups = [(i, g.kv_cache_spec, g.layer_names)
                       for i, g in enumerate(config.kv_cache_groups)]

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

    @torch.inference_mode()
    def execute(self, batch: Sequence[ScheduledSeq], kv: KVCacheManager) -> torch.Tensor:
        """Run one step; return float32 logits [num sampling seqs, vocab] in batch order."""
        block_ids = [kv.get_block_ids(item.seq.request_id) for item in batch]
        input_ids, positions = self._inputs(batch)
        starts = [0]
        for item in batch:
            starts.append(starts[-1] + item.num_new)
        attn, mamba = {}, {}
        for gid, spec, names in self.groups:
            ids = [b[gid] for b in block_ids]
            if isinstance(spec, AttentionSpec):
                meta = self._attention_batch(batch, ids, spec.block_size, starts)
                attn.update(dict.fromkeys(names, meta))
            elif isinstance(spec, MambaSpec):
                mb = self._mamba_batch(batch, ids, spec.block_size, starts, kv.null_block_id)
                mamba.update(dict.fromkeys(names, mb))
        logits_indices = torch.tensor([starts[i + 1] - 1 for i, item in enumerate(batch)
                                       if item.samples], dtype=torch.long, device=self.device)
        if mamba:
            return self.runner.forward(input_ids, positions, attn, logits_indices,
                                       mamba_batches=mamba)
        return self.runner.forward(input_ids, positions, attn, logits_indices)

    def _inputs(self, batch: Sequence[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens: list[int] = []
        positions: list[int] = []
        for item in batch:
            c, n = item.num_computed, item.num_new
            tokens.extend(item.seq.request.all_token_ids[c:c + n])
            positions.extend(range(c, c + n))
        return (torch.tensor(tokens, dtype=torch.long, device=self.device),
                torch.tensor(positions, dtype=torch.long, device=self.device))

    def _attention_batch(self, batch: Sequence[ScheduledSeq], ids: list[list[int]],
                         block_size: int, starts: list[int]) -> AttentionBatch:
        width = max(len(row) for row in ids)
        table = np.zeros((len(ids), width), dtype=np.int32)  # 0: the null block
        for s, row in enumerate(ids):
            table[s, :len(row)] = row
        slots: list[int] = []
        for item, row in zip(batch, ids):
            c = item.num_computed
            slots += [row[p // block_size] * block_size + p % block_size
                      for p in range(c, c + item.num_new)]
        seq_lens = [item.num_computed + item.num_new for item in batch]
        dev = self.device
        return AttentionBatch(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_table=torch.from_numpy(table).to(dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            max_query_len=max(item.num_new for item in batch),
            max_seq_len=max(seq_lens),
        )

    @staticmethod
    def _mamba_batch(batch: Sequence[ScheduledSeq], ids: list[list[int]], block_size: int,
                     starts: list[int], null_block_id: int) -> MambaBatch:
        plans = [mamba_state_plan(row, item.num_computed, item.num_new, block_size,
                                  null_block_id) for item, row in zip(batch, ids)]
        return MambaBatch(
            query_start_loc=list(starts),
            live_blocks=[p.live_block_id for p in plans],
            source_blocks=[p.source_block_id for p in plans],
            has_initial_state=[item.num_computed > 0 for item in batch],
            checkpoints=[p.checkpoints for p in plans],
        )
