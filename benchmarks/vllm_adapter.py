"""vLLM 0.32's v1 `KVCacheManager` behind the replay driver's adapter interface.

Imported only by `vs_vllm_worker.py --side vllm`, in a Python environment
that has vLLM (see `bench_vs_vllm.py`). The adapter makes the calls vLLM's own
scheduler (`vllm/v1/core/sched/scheduler.py`) makes, with its defaults:

- requests carry their block hashes, computed by the hasher vLLM's engine
  builds (`get_request_block_hasher` over `get_hash_fn_by_name(algo)`, after
  `init_none_hash`), at construction and on every appended token;
- an admission looks up `get_computed_blocks` (keeping the shared-prefix
  boundary on the request, as the scheduler does) and allocates with
  `full_sequence_must_fit=True` (`scheduler_reserve_full_isl` defaults on);
  a running request allocates its next tokens only;
- every step starts with `new_step_starts()` and drains what the manager
  queued during the previous one (new block ids, copy-on-write copies, whose
  retained blocks are then freed, and Mamba boundary-state hand-offs);
- Mamba groups use `mamba_cache_mode="align"` (vLLM's default when prefix
  caching is on, with the Mamba block size equal to the attention one), whose
  prefill chunks the scheduler clips to block boundaries: `clip_chunk` runs
  the scheduler's own `_mamba_block_aligned_split` on the scheduler settings
  of this replay (no speculative decoding, no prefill checkpoint blocks);
- a preemption frees the request and resets it as `_preempt_request` does.

Attention pages are one 64-wide fp16 KV head (4 KiB per block) and the Mamba
state is padded to the same page size; the manager never touches the bytes.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

HEAD_SIZE = 64


def make_vllm_config(kind: str, num_blocks: int, window: int, block_size: int) -> KVCacheConfig:
    """vLLM's layout of the replay's configs: `full`, `swa` (+ window) or `mamba` (+ Mamba)."""
    attn = dict(block_size=block_size, num_kv_heads=1, head_size=HEAD_SIZE, dtype=torch.float16)
    groups = [KVCacheGroupSpec(["full.0"], FullAttentionSpec(**attn))]
    if kind == "swa":
        spec = SlidingWindowSpec(**attn, sliding_window=window)
        groups.append(KVCacheGroupSpec(["swa.0"], spec))
    elif kind == "mamba":
        page = groups[0].kv_cache_spec.page_size_bytes
        spec = MambaSpec(block_size=block_size, shapes=((page // 2,),), dtypes=(torch.float16,),
                         mamba_cache_mode="align")
        groups.append(KVCacheGroupSpec(["mamba.0"], spec))
    elif kind != "full":
        raise ValueError(f"config {kind!r} is unknown; use full, swa or mamba")
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


class VllmAdapter:
    """The replay driver's view of vLLM's `KVCacheManager` (same methods as hybridkv's)."""

    def __init__(self, config: KVCacheConfig, *, max_batched_tokens: int, max_model_len: int,
                 hash_algo: str = "sha256") -> None:
        block_size = config.kv_cache_groups[0].kv_cache_spec.block_size
        hash_fn = get_hash_fn_by_name(hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block_size, hash_fn)
        self.manager = KVCacheManager(
            config, max_model_len=max_model_len, scheduler_block_size=block_size,
            hash_block_size=block_size, max_in_flight_tokens=max_batched_tokens,
            enable_caching=True)
        self.num_blocks = config.num_blocks
        self._hits: dict[str, tuple] = {}
        self._params: dict[int, SamplingParams] = {}
        if any(isinstance(g.kv_cache_spec, MambaSpec) for g in config.kv_cache_groups):
            self._scheduler_view = self._mamba_scheduler_view(block_size, max_batched_tokens)
            self.clip_chunk = self._clip_chunk

    def _mamba_scheduler_view(self, block_size: int, max_batched_tokens: int) -> SimpleNamespace:
        """The scheduler attributes `_mamba_block_aligned_split` reads, as the scheduler
        sets them for this configuration."""
        hash_block_size = block_size  # the engine hashes at the scheduler's block size
        partial_hits = (hash_block_size < block_size
                        and self.manager.coordinator.enable_partial_hash_hits)
        return SimpleNamespace(
            cache_config=SimpleNamespace(block_size=block_size),
            block_size=block_size, hash_block_size=hash_block_size,
            mamba_partial_cache_hit=partial_hits,
            use_eagle_block_drop=False,
            mamba_has_prefill_checkpoint_blocks=False,
            mamba_prefill_checkpoint_alignment=None,
            mamba_shared_prefix_checkpoint=self.manager.mamba_shared_prefix_checkpoint,
            max_num_scheduled_tokens=max_batched_tokens,
            scheduler_config=SimpleNamespace(long_prefill_token_threshold=0))

    def start(self, tr) -> Request:
        return self.new_request(tr.request_id, tr.prompt, len(tr.output))

    def new_request(self, request_id: str, prompt, num_output: int) -> Request:
        """vLLM's Request for a prompt that will decode `num_output` tokens (hashed now)."""
        params = self._params.get(num_output)
        if params is None:
            params = SamplingParams(max_tokens=max(1, num_output))
            self._params[num_output] = params
        return Request(request_id, list(prompt), params, None,
                       arrival_time=0.0, block_hasher=self.hasher)

    def lookup(self, req: Request) -> int:
        blocks, num_cached, boundary = self.manager.get_computed_blocks(req)
        req.shared_prefix_boundary = boundary
        self._hits[req.request_id] = (blocks, num_cached)
        return num_cached

    def allocate(self, req: Request, num_tokens: int) -> bool:
        blocks, num_cached = self._hits.pop(req.request_id, (None, 0))
        admitting = req.status != RequestStatus.RUNNING
        if admitting:
            new = self.manager.allocate_slots(req, num_tokens, num_cached, blocks,
                                              full_sequence_must_fit=True)
        else:
            new = self.manager.allocate_slots(req, num_tokens)
        if new is None:
            return False
        req.num_computed_tokens += num_cached + num_tokens
        req.status = RequestStatus.RUNNING
        return True

    def _clip_chunk(self, req: Request, num_tokens: int) -> int:
        """The scheduler's block-aligned prefill split (Mamba "align" mode)."""
        pending = self._hits.get(req.request_id)
        num_cached = pending[1] if pending is not None else 0
        return Scheduler._mamba_block_aligned_split(self._scheduler_view, req, num_tokens,
                                                    num_cached)

    def append(self, req: Request, token_id: int) -> None:
        req.append_output_token_ids(token_id)

    def free(self, req: Request) -> None:
        self.manager.free(req)

    def preempt(self, req: Request) -> None:
        self.manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1

    def new_step(self) -> None:
        self.drain()
        self.manager.new_step_starts()

    def drain(self) -> None:
        """What the scheduler takes from the manager at the end of every step."""
        self.manager.take_new_block_ids()
        self.manager.take_boundary_state_offloads()
        _copies, retained = self.manager.take_kv_cache_block_copies()
        if retained:
            self.manager.block_pool.free_blocks(retained)

    @property
    def num_free_blocks(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()
