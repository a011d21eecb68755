"""Test-side paged KV cache for model runners, and the Hugging Face oracles.

`PagedCache` allocates the runner's K/V tensors from its specs, hands out
shuffled non-contiguous block ids (never the null block 0), builds one
`AttentionBatch` per layer for each step and returns the logits of every new
token. With `drop_outside=True` the blocks no query of a step can see (before
a sliding window or before the current chunk) are replaced by the null block
in that layer's block table; with `poison_null=True` block 0 holds NaN, so a
layer that read it would produce NaN logits.
"""

from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM

from hybridkv.kernels.attention import AttentionBatch
from hybridkv.kv_cache.specs import ChunkedLocalAttentionSpec, SlidingWindowSpec
from hybridkv.models import ModelRunner, get_preset


def build_model(preset: str, *, seed: int = 0, **overrides):
    """The preset's Hugging Face model with config values overridden, seeded, eval mode."""
    config = get_preset(preset).build_config(**overrides)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def random_tokens(num_tokens: int, *, vocab_size: int = 512, seed: int = 0) -> list[int]:
    """Seeded token ids in [3, vocab_size) (0-2 are pad/bos/eos in the presets)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (num_tokens,), generator=generator).tolist()


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """Hugging Face's own forward over the whole sequence, no cache: float32 [L, vocab]."""
    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float()


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, *, tol: float = 1e-4) -> None:
    """Equal to float32 precision, relative to the logits' scale."""
    assert not torch.isnan(ours).any(), "NaN logits"
    atol = tol * max(1.0, ref.abs().max().item())
    torch.testing.assert_close(ours, ref, rtol=0.0, atol=atol)


class PagedCache:
    """K/V tensors bound to `runner`, a block allocator and per-step batches."""

    def __init__(self, runner: ModelRunner, *, block_size: int = 4, num_blocks: int = 96,
                 seed: int = 0, drop_outside: bool = False, poison_null: bool = False) -> None:
        self.runner = runner
        self.block_size = block_size
        self.drop_outside = drop_outside
        self.specs = runner.kv_cache_specs(block_size)
        caches = {}
        for name, spec in self.specs.items():
            shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_size)
            k_cache = torch.zeros(shape, dtype=runner.dtype)
            v_cache = torch.zeros(shape, dtype=runner.dtype)
            if poison_null:
                k_cache[0], v_cache[0] = float("nan"), float("nan")
            caches[name] = (k_cache, v_cache)
        runner.bind_kv_cache(caches)
        self.free_blocks = list(range(1, num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.seq_blocks: dict[str, list[int]] = {}
        self.seq_lens: dict[str, int] = {}
        self.num_dropped = 0  # block-table entries replaced by the null block so far

    def step(self, chunks: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Feed new tokens of several sequences in one batch; logits [n, vocab] per sequence."""
        ids, positions, slots = [], [], []
        for seq_id, tokens in chunks.items():
            start = self.seq_lens.get(seq_id, 0)
            self._allocate(seq_id, start + len(tokens))
            ids += tokens
            positions += range(start, start + len(tokens))
            slots += [self._slot(seq_id, pos) for pos in range(start, start + len(tokens))]
            self.seq_lens[seq_id] = start + len(tokens)
        batches = self._batches(chunks, torch.tensor(slots, dtype=torch.int64))
        num_tokens = len(ids)
        logits = self.runner.forward(torch.tensor(ids), torch.tensor(positions), batches,
                                     torch.arange(num_tokens))
        assert logits.shape == (num_tokens, self.runner.vocab_size)
        assert logits.dtype == torch.float32
        return dict(zip(chunks, logits.split([len(t) for t in chunks.values()])))

    def _allocate(self, seq_id: str, num_tokens: int) -> None:
        blocks = self.seq_blocks.setdefault(seq_id, [])
        while len(blocks) * self.block_size < num_tokens:
            blocks.append(self.free_blocks.pop())

    def _slot(self, seq_id: str, pos: int) -> int:
        block = self.seq_blocks[seq_id][pos // self.block_size]
        return block * self.block_size + pos % self.block_size

    def _batches(self, chunks: dict[str, list[int]], slots: torch.Tensor) -> dict:
        counts = [len(tokens) for tokens in chunks.values()]
        query_start_loc = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()],
                                       dtype=torch.int32)
        seq_lens = torch.tensor([self.seq_lens[s] for s in chunks], dtype=torch.int32)
        by_spec = {}
        for spec in set(self.specs.values()):
            table = self._block_table(chunks, spec)
            by_spec[spec] = AttentionBatch(query_start_loc, seq_lens, table, slots)
        return {name: by_spec[spec] for name, spec in self.specs.items()}

    def _block_table(self, chunks: dict[str, list[int]], spec) -> torch.Tensor:
        max_blocks = max(len(self.seq_blocks[s]) for s in chunks)
        table = torch.zeros(len(chunks), max_blocks, dtype=torch.int32)
        for row, (seq_id, tokens) in enumerate(chunks.items()):
            blocks = list(self.seq_blocks[seq_id])
            first_query = self.seq_lens[seq_id] - len(tokens)
            first_needed = _first_needed_position(spec, first_query) if self.drop_outside else 0
            num_dropped = first_needed // self.block_size  # blocks wholly before it
            blocks[:num_dropped] = [0] * num_dropped
            self.num_dropped += num_dropped
            table[row, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        return table


def _first_needed_position(spec, first_query: int) -> int:
    """Earliest key position any query at or after `first_query` can see under `spec`."""
    if isinstance(spec, SlidingWindowSpec):
        return max(0, first_query - spec.sliding_window + 1)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return first_query // spec.attention_chunk_size * spec.attention_chunk_size
    return 0


def run_chunked(runner: ModelRunner, tokens: list[int], chunk_sizes: list[int],
                **cache_options) -> tuple[torch.Tensor, PagedCache]:
    """Prefill `tokens` in chunks of `chunk_sizes`, then one-token steps.

    Returns the logits of every token [L, vocab] and the cache.
    """
    cache = PagedCache(runner, **cache_options)
    rows, start = [], 0
    for size in chunk_sizes:
        rows.append(cache.step({"a": tokens[start:start + size]})["a"])
        start += size
    for pos in range(start, len(tokens)):
        rows.append(cache.step({"a": [tokens[pos]]})["a"])
    return torch.cat(rows), cache


def greedy_generate(runner: ModelRunner, prompt: list[int], max_new_tokens: int,
                    first_chunk: int) -> list[int]:
    """Greedy decoding with the runner: two prefill chunks, then one token per step."""
    cache = PagedCache(runner)
    cache.step({"a": prompt[:first_chunk]})
    logits = cache.step({"a": prompt[first_chunk:]})["a"]
    output: list[int] = []
    while True:
        token = int(logits[-1].argmax())
        output.append(token)
        if len(output) == max_new_tokens or token in runner.eos_token_ids:
            return output
        logits = cache.step({"a": [token]})["a"]


def hf_generate(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face's greedy generation (its own cache), new tokens only."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def run_schedule(runner: ModelRunner, schedule: list[dict[str, list[int]]],
                 **cache_options) -> dict[str, torch.Tensor]:
    """Run batched steps (seq id -> new tokens); all logits of each sequence [L, vocab]."""
    cache = PagedCache(runner, **cache_options)
    rows: dict[str, list[torch.Tensor]] = {}
    for chunks in schedule:
        for seq_id, logits in cache.step(chunks).items():
            rows.setdefault(seq_id, []).append(logits)
    return {seq_id: torch.cat(parts) for seq_id, parts in rows.items()}


# ------------------------------------------------------------------ checks shared by families
def check_chunked_prefill_and_decode(model, runner: ModelRunner, *, length: int = 84,
                                     chunk_sizes: tuple[int, ...] = (37, 5, 30),
                                     block_size: int = 4) -> None:
    """Uneven prefill chunks then decode steps give HF's full-sequence logits, row by row."""
    tokens = random_tokens(length, vocab_size=runner.vocab_size)
    ours, _ = run_chunked(runner, tokens, list(chunk_sizes), block_size=block_size)
    assert_logits_close(ours, hf_logits(model, tokens))


def check_null_blocks_never_read(model, runner: ModelRunner, *, length: int = 90,
                                 chunk_sizes: tuple[int, ...] = (41, 23), block_size: int = 4,
                                 expect_dropped: bool = True) -> None:
    """Blocks outside every window/chunk become the NaN-filled null block: logits unchanged."""
    tokens = random_tokens(length, vocab_size=runner.vocab_size, seed=1)
    ours, cache = run_chunked(runner, tokens, list(chunk_sizes), block_size=block_size,
                              drop_outside=True, poison_null=True)
    assert (cache.num_dropped > 0) == expect_dropped
    assert_logits_close(ours, hf_logits(model, tokens))


def check_mixed_batch(model, runner: ModelRunner) -> None:
    """One sequence decoding while another prefills, in one batch, equals each run alone."""
    a = random_tokens(48, vocab_size=runner.vocab_size, seed=2)
    b = random_tokens(45, vocab_size=runner.vocab_size, seed=3)
    schedule = [{"a": a[:40]}, {"a": a[40:41], "b": b[:20]}, {"b": b[20:37], "a": a[41:42]}]
    schedule += [{"a": [a[pos]], "b": [b[pos - 5]]} for pos in range(42, 48)]
    schedule += [{"b": [b[pos]]} for pos in range(43, 45)]
    batched = run_schedule(runner, schedule, block_size=8)
    for seq_id, tokens in (("a", a), ("b", b)):
        alone_schedule = [{seq_id: c[seq_id]} for c in schedule if seq_id in c]
        alone = run_schedule(runner, alone_schedule, block_size=8)[seq_id]
        assert batched[seq_id].shape == (len(tokens), runner.vocab_size)
        assert_logits_close(batched[seq_id], alone, tol=1e-5)
        assert_logits_close(batched[seq_id], hf_logits(model, tokens))


def check_greedy_matches_generate(model, runner: ModelRunner, *, prompt_len: int = 45,
                                  max_new_tokens: int = 10) -> None:
    """The runner's greedy loop picks HF `generate(do_sample=False)`'s tokens."""
    prompt = random_tokens(prompt_len, vocab_size=runner.vocab_size, seed=4)
    expected = hf_generate(model, prompt, max_new_tokens)
    assert len(expected) >= 1
    assert greedy_generate(runner, prompt, max_new_tokens, first_chunk=prompt_len // 3) == expected


def spec_kinds(runner: ModelRunner, block_size: int = 4) -> list[tuple]:
    """Per layer, in order: ("full",), ("sliding", W) or ("chunked", C); checks head shapes."""
    kinds = []
    num_heads, num_kv_heads, head_dim = runner.head_dims()
    for index, (name, spec) in enumerate(runner.kv_cache_specs(block_size).items()):
        assert name == f"layers.{index}.attn"
        assert (spec.block_size, spec.num_kv_heads, spec.head_size) == (block_size, num_kv_heads,
                                                                         head_dim)
        assert spec.dtype == "float32"
        if isinstance(spec, SlidingWindowSpec):
            kinds.append(("sliding", spec.sliding_window))
        elif isinstance(spec, ChunkedLocalAttentionSpec):
            kinds.append(("chunked", spec.attention_chunk_size))
        else:
            kinds.append(("full",))
    return kinds


ALL_CHECKS = (check_chunked_prefill_and_decode, check_null_blocks_never_read, check_mixed_batch,
              check_greedy_matches_generate)
