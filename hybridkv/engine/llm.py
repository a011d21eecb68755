"""LLM: the offline engine. Prompts in, tokens out, prefixes reused."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hybridkv.engine.chat import render_conversations
from hybridkv.engine.executor import ModelExecutor
from hybridkv.engine.logprobs import PromptRows, add_prompt_logprobs, forward_with_rows, prompt_rows
from hybridkv.engine.outputs import OutputProcessor
from hybridkv.engine.sampling import (
    RequestOutput,
    Sampler,
    SamplingParams,
)
from hybridkv.engine.scheduler import ScheduledSeq, Scheduler, SeqState
from hybridkv.engine.tokenizer import load_tokenizer
from hybridkv.kv_cache.checks import check_int
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.models.registry import load_model

if TYPE_CHECKING:
    from hybridkv.store.stats import KVStoreStats

DEFAULT_KV_CACHE_BYTES = 64 << 20
# keys of a prompt given as a dict: the tokens (or text) and the keys of its cached blocks
_PROMPT_KEYS = ("prompt_token_ids", "prompt", "cache_salt", "lora_name")


@dataclass
class EngineStats:
    """Cumulative numbers of one LLM instance."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    steps: int
    preemptions: int
    evictions: int
    pool_usage: float
    num_blocks: int

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class LLM:
    """A hybrid model served with prefix caching on one shared block pool.

    `model`: a built-in preset name (`hybridkv.models.list_presets()`), a local
    Hugging Face checkpoint directory, or a `transformers` PreTrainedModel.
    The pool is sized by `num_blocks`, else by `kv_cache_memory_bytes`
    (default 64 MiB). Errors in the model or the sizes raise ValueError /
    FileNotFoundError before anything is allocated.

    `tokenizer` (a `transformers` tokenizer or a directory of tokenizer
    files) makes string prompts and `chat` work; without it a preset uses its
    built-in tokenizer, a checkpoint directory its own tokenizer files, and a
    model object none (`self.tokenizer` is then None).

    `kv_store` (a URL `cpu://?size=4GiB`, `file:///dir?size=20GiB`,
    `redis://host:port/db`, a `hybridkv.store.KVStore`, or True for `cpu://`)
    puts a second tier behind the pool: evicted blocks are written there and
    prefixes the pool lacks are read back (`kv_store_write_through`: write
    blocks when computed instead; `kv_store_select`: "hybrid" or "all", which
    evicted blocks to keep). See docs/kv_tiers.md.

    `prepack_weights` (CPU, float32): keep a oneDNN-packed copy of the linear
    weights for steps of 2 tokens or more (faster decode and prefill; a second copy of those
    weights in memory; weights changed after start-up are not seen by it).
    """

    def __init__(self, model: Any, *, enable_prefix_caching: bool = True, block_size: int = 16,
                 num_blocks: int | None = None, kv_cache_memory_bytes: int | None = None,
                 device: str = "cpu", dtype: Any = None, seed: int = 0,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 2048,
                 hash_algo: str = "sha256", eviction_policy: str = "hybrid",
                 poison_kv_cache: bool = False, tokenizer: Any = None, kv_store: Any = None,
                 kv_store_write_through: bool = False, kv_store_select: str = "hybrid",
                 prepack_weights: bool = True) -> None:
        self.runner = load_model(model, dtype=dtype, seed=seed)
        self.tokenizer = load_tokenizer(model, tokenizer)
        if device != "cpu":
            self.runner.model.to(device)
        elif prepack_weights:
            self.runner.prepack_weights()
        self.config = self._kv_cache_config(block_size, num_blocks, kv_cache_memory_bytes)
        _check_device_memory(self.config, device)
        self.kv = KVCacheManager(self.config, enable_caching=enable_prefix_caching,
                                 hash_algo=hash_algo, eviction_policy=eviction_policy)
        self.executor = ModelExecutor(self.runner, self.config, device, poison=poison_kv_cache)
        self.tier = None
        if kv_store is not None and kv_store is not False:
            from hybridkv.store.attach import attach_store

            self.tier = attach_store(self.kv, kv_store, self.config, self.executor.kv_slots,
                                     self.runner.model, write_through=kv_store_write_through,
                                     select=kv_store_select)
        self.scheduler = Scheduler(self.kv, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens, tier=self.tier)
        if poison_kv_cache:
            self.kv.on_stale_blocks(self._poison_blocks)
        self.sampler = Sampler(seed)
        self.outputs = OutputProcessor(self.sampler, self.tokenizer, self.runner)
        self._counter = 0

    def _kv_cache_config(self, block_size: int, num_blocks: int | None,
                         budget: int | None) -> KVCacheConfig:
        check_int("block_size", block_size, 1)
        specs = self.runner.kv_cache_specs(block_size)
        if num_blocks is None:
            return KVCacheConfig.from_layer_specs(
                specs, DEFAULT_KV_CACHE_BYTES if budget is None else budget)
        check_int("num_blocks", num_blocks, 2)
        layout = KVCacheConfig.from_layer_specs(specs, 1 << 40)
        return dataclasses.replace(layout, num_blocks=num_blocks)

    # ---- generation ----------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int] | str | Mapping[str, Any]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for every prompt; outputs in prompt order.

        A prompt is a token-id list (or a 1-D integer numpy array or torch
        tensor), a string (with a tokenizer), or a dict
        `{"prompt_token_ids": [...] (or "prompt": text), "cache_salt": ...,
        "lora_name": ...}`. `cache_salt` (str or bytes) keys the prompt's
        first block, so only requests with the same salt share its cached KV
        (one salt per tenant closes the prefix-cache timing side channel).
        `lora_name` keys every block, so requests under different adapters
        never share KV (the built-in runners load no adapter weights: it
        changes only what is reused).

        Every prompt is validated first (ValueError naming the bad one, nothing
        scheduled): empty, token ids outside the vocabulary, longer than the
        model's context, too large for the whole pool, or malformed keys.
        """
        arrival = time.perf_counter()
        seqs = self._make_seqs(prompts, sampling_params)
        for seq in seqs:
            seq.arrival_time = arrival
            self.scheduler.add(seq)
        progress = _progress(len(seqs), use_tqdm)
        while self.scheduler.has_work():
            done = self.step()
            if progress is not None and done:
                progress.update(done)
        if progress is not None:
            progress.close()
        return [self.outputs.request_output(seq) for seq in seqs]

    def chat(self, messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             *, add_generation_prompt: bool = True, use_tqdm: bool = False
             ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of `{"role", "content"}`
        messages) or a list of them, rendered with the tokenizer's chat template
        (`hybridkv.engine.chat.render_chat`). ValueError naming the conversation
        and message for a bad message, or when there is no tokenizer or template.
        """
        prompts = render_conversations(self.tokenizer, messages,
                                       add_generation_prompt=add_generation_prompt)
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def step(self) -> int:
        """Schedule and run one step; return how many requests finished.

        A failure while handling one request (its KV cache lookup, logits
        extras, sampling, logprobs, detokenizing, stop strings) ends that
        request alone: finish_reason "error", `error` naming the cause, its
        blocks freed. A failure of the whole batch (the model forward) raises.
        """
        num_failed = self.scheduler.stats.failed
        batch = self.scheduler.schedule()
        num_failed = self.scheduler.stats.failed - num_failed
        if not batch:
            if num_failed:
                return num_failed
            raise RuntimeError("no request could be scheduled although the pool was checked; "
                               "this is a bug")
        if self.tier is not None:
            self.tier.before_step()  # evicted blocks leave before the step overwrites them
        rows = prompt_rows(batch)
        logits, row_logits = self._execute(batch, rows)
        if self.tier is not None:
            self.tier.after_step()
        self.scheduler.finish_step(batch)
        num_failed += self._add_prompt_logprobs(rows, row_logits)
        return num_failed + self._sample(batch, logits)

    def _execute(self, batch: list[ScheduledSeq], rows: list[PromptRows]
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sampling logits [S, vocab], and those of the prompt-logprob rows."""
        if not rows:
            return self.executor.execute(batch, self.kv), None
        with forward_with_rows(self.executor, [i for r in rows for i in r.flat_indices]) as tap:
            logits = self.executor.execute(batch, self.kv)
        return logits, tap.extra_logits

    def _add_prompt_logprobs(self, rows: list[PromptRows], logits: torch.Tensor | None) -> int:
        """Fill prompt logprobs from `logits` [rows, vocab]; return how many failed."""
        start = num_failed = 0
        for r in rows:
            assert logits is not None
            part = logits[start:start + len(r.flat_indices)]
            start += len(r.flat_indices)
            try:
                add_prompt_logprobs(r, part)
            except Exception as error:
                num_failed += self._fail(r.seq, "prompt logprobs", error)
        return num_failed

    def _fail(self, seq: SeqState, stage: str, error: Exception) -> int:
        """End `seq` alone with finish_reason "error"; return 1."""
        self.scheduler.fail(seq, f"{stage} failed: {type(error).__name__}: {error}")
        self.sampler.forget(seq.request_id)
        return 1

    def _poison_blocks(self, block_ids: list[int]) -> None:
        if self.tier is not None:
            self.tier.before_step()  # copy out evicted data before the NaN fill
        self.executor.poison_blocks(block_ids)

    def _sample(self, batch: list[ScheduledSeq], logits: torch.Tensor) -> int:
        finished = 0
        row = -1
        now = None
        for item in batch:
            if not item.samples:
                continue
            row += 1
            seq = item.seq
            if seq.finish_reason is not None:  # failed earlier in this step
                continue
            try:
                token = self.outputs.next_token(seq, logits[row])
            except Exception as error:
                finished += self._fail(seq, "sampling", error)
                continue
            if seq.first_token_time is None:
                now = now or time.perf_counter()
                seq.first_token_time = now
            try:
                reason = self.outputs.stop_reason(seq, token)
            except Exception as error:
                finished += self._fail(seq, "stop check", error)
                continue
            if reason is not None:
                seq.finished_time = time.perf_counter()
                self.scheduler.finish(seq, reason)
                self.sampler.forget(seq.request_id)
                finished += 1
        return finished

    # ---- one request at a time (serving) --------------------------------------

    def add_request(self, prompt: Sequence[int] | str | Mapping[str, Any],
                    params: SamplingParams | None = None, *, request_id: str | None = None,
                    arrival_time: float | None = None) -> SeqState:
        """Queue one prompt (as `generate` takes it) for the next `step()` calls.

        Validated like `generate` (ValueError, nothing queued). `params.n`
        must be 1 (add one request per sample). Returns the request's live
        state: `request.output_token_ids` grow as `step()` samples,
        `finish_reason` is set when it ends. `request_id` defaults to a fresh one.
        """
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams) or params.n != 1:
            raise ValueError(f"add_request takes one SamplingParams with n=1, got {params!r}")
        ids, keys = self._prompt_parts(0, prompt)
        self._check_fits(0, ids, params)
        rid = f"req-{self._counter + 1}" if request_id is None else request_id
        request = self._request(0, rid, ids, keys)
        self._counter += 1
        seq = SeqState(request, params, self._counter)
        seq.arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        self.scheduler.add(seq)
        return seq

    def abort_request(self, request_id: str) -> bool:
        """Stop a queued or running request and free its blocks; False if not found."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return False
        seq.finished_time = time.perf_counter()
        self.sampler.forget(request_id)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    # ---- validation ----------------------------------------------------------

    def _make_seqs(self, prompts: Sequence[Sequence[int] | str],
                   params: SamplingParams | Sequence[SamplingParams] | None) -> list[SeqState]:
        if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
            raise ValueError("prompts must be a non-empty list of token-id lists or strings")
        per_prompt = _per_prompt_params(params, len(prompts))
        parts = [self._prompt_parts(i, prompt) for i, prompt in enumerate(prompts)]
        for i, ((ids, _), p) in enumerate(zip(parts, per_prompt)):
            self._check_fits(i, ids, p)
        seqs: list[SeqState] = []
        number = self._counter
        for i, ((ids, keys), p) in enumerate(zip(parts, per_prompt)):
            for sample in range(p.n):  # sample k of a seeded prompt uses seed + k
                number += 1
                sample_params = p if sample == 0 or p.seed is None else \
                    dataclasses.replace(p, seed=p.seed + sample)
                request = self._request(i, f"req-{number}", ids, keys)
                seqs.append(SeqState(request, sample_params, len(seqs)))
        self._counter = number
        return seqs

    def _prompt_parts(self, i: int, prompt: Any) -> tuple[list[int], dict[str, Any]]:
        """Token ids of prompt `i` and the cache keys a dict prompt carries."""
        if not isinstance(prompt, Mapping):
            return self._token_ids(i, prompt), {}
        keys = sorted(map(str, prompt))
        if set(keys) - set(_PROMPT_KEYS) or ("prompt_token_ids" in keys) == ("prompt" in keys):
            raise ValueError(f"prompt {i}: a dict prompt takes one of prompt_token_ids / "
                             f"prompt, and cache_salt, lora_name; got keys {keys}")
        salt, lora = prompt.get("cache_salt"), prompt.get("lora_name")
        if salt is not None and (not isinstance(salt, str | bytes) or not salt):
            raise ValueError(f"prompt {i}: cache_salt must be a non-empty str or bytes, "
                             f"got {salt!r}")
        if lora is not None and (not isinstance(lora, str) or not lora):
            raise ValueError(f"prompt {i}: lora_name must be a non-empty str, got {lora!r}")
        text = prompt.get("prompt_token_ids", prompt.get("prompt"))
        return self._token_ids(i, text), {"cache_salt": salt, "lora_name": lora}

    def _token_ids(self, i: int, prompt: Sequence[int] | str) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt {i} is a string but this model has no tokenizer; "
                                 f"pass token ids")
            prompt = list(self.tokenizer.encode(prompt))
        prompt = _array_to_list(i, prompt)
        if not isinstance(prompt, Sequence) or len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty or not a list of token ids")
        return list(prompt)  # the ids are checked by Request, against the vocabulary

    def _request(self, i: int, request_id: str, ids: list[int], keys: dict[str, Any]) -> Request:
        """Request `request_id` of prompt `i`; its checks' errors name the prompt."""
        try:
            return Request(request_id, ids, vocab_size=self.runner.vocab_size, **keys)
        except ValueError as error:
            raise ValueError(f"prompt {i}: {error}") from None

    def _check_fits(self, i: int, ids: list[int], params: SamplingParams) -> None:
        for token in params.logit_bias or ():
            if token >= self.runner.vocab_size:
                raise ValueError(f"prompt {i}: SamplingParams.logit_bias has token id {token}, "
                                 f"outside the vocabulary (size {self.runner.vocab_size})")
        if params.stop and self.tokenizer is None:
            raise ValueError(f"prompt {i}: stop strings {list(params.stop)} need a tokenizer, "
                             f"which this model lacks; use stop_token_ids")
        limit = self.runner.max_model_len
        if len(ids) >= limit:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; the model's context is "
                             f"{limit} tokens (at most {limit - 1} leave room for an output)")
        total = min(len(ids) + params.max_tokens, limit)
        if not self.kv.can_fit(total, self.scheduler.max_num_batched_tokens):
            raise ValueError(f"prompt {i} needs more KV cache blocks than the whole pool has "
                             f"({self.config.num_blocks} blocks); raise num_blocks or "
                             f"kv_cache_memory_bytes")

    # ---- stats ---------------------------------------------------------------

    @property
    def stats(self) -> EngineStats:
        s = self.scheduler.stats
        return EngineStats(requests=self._counter, prompt_tokens=s.prompt_tokens,
                           cached_tokens=s.cached_tokens, steps=s.steps,
                           preemptions=s.preemptions, evictions=self.kv.num_evictions,
                           pool_usage=self.kv.usage, num_blocks=self.config.num_blocks)


    def kv_store_stats(self) -> KVStoreStats | None:
        """Counters of the KV store behind the pool (None without one): store
        hits in tokens, blocks and bytes read and written per group, load and
        store time, rejected payloads, errors; see `hybridkv.store.KVStoreStats`."""
        return None if self.tier is None else self.tier.stats()

    def flush_kv_store(self, timeout: float | None = None) -> bool:
        """Wait until blocks handed to the KV store are written (True when done)."""
        return True if self.tier is None else self.tier.flush(timeout)

    def close(self) -> None:
        """Write what the KV store's writer still holds, then close the store."""
        if self.tier is not None:
            self.tier.close()


def _check_device_memory(config: KVCacheConfig, device: str) -> None:
    """ValueError when the pool would not fit in the device's memory at all
    (a typo'd num_blocks would otherwise build millions of block records)."""
    if torch.device(device).type == "cuda":
        limit = torch.cuda.get_device_properties(torch.device(device)).total_memory
    else:
        try:
            limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # not a POSIX system: unchecked
            return
    if config.total_bytes > limit:
        raise ValueError(f"a pool of {config.num_blocks} blocks needs {config.total_bytes} "
                         f"bytes of KV cache, more than the {limit} bytes of memory on "
                         f"{device}; lower num_blocks or kv_cache_memory_bytes")


def _array_to_list(i: int, prompt: Any) -> Any:
    """A 1-D integer numpy array or torch tensor as a list of ints; other values as given.
    ValueError naming prompt `i` for an array of another shape or dtype."""
    if isinstance(prompt, torch.Tensor):
        shape, dtype = tuple(prompt.shape), prompt.dtype
        integer = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    elif isinstance(prompt, np.ndarray):
        shape, dtype = prompt.shape, prompt.dtype
        integer = np.issubdtype(dtype, np.integer)
    else:
        return prompt
    if len(shape) != 1 or not integer:
        raise ValueError(f"prompt {i}: an array prompt must be 1-D integer token ids, got "
                         f"shape {shape} and dtype {dtype}")
    return prompt.tolist()


def _per_prompt_params(params: SamplingParams | Sequence[SamplingParams] | None,
                       n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n or not all(isinstance(p, SamplingParams) for p in params):
        raise ValueError(f"sampling_params must be one SamplingParams or one per prompt ({n})")
    return list(params)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="generate", unit="req")
