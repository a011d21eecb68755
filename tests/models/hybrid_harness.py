"""Test-side paged cache for attention/Mamba hybrid runners, and the Hugging Face oracles.

`HybridCache` binds K/V tensors and Mamba state views to a runner, hands out
shuffled block ids (never the null block 0, which holds NaN in K/V), keeps
per sequence its attention blocks, its live state block and a checkpoint
block for every block boundary a step crosses, and builds the step's
`AttentionBatch` and `MambaBatch`. Mamba state memory starts as NaN, so a
state read before it was written poisons the logits.

`fork(child, parent, prefix_len)` makes a sequence that reuses the parent's
first `prefix_len` tokens: the parent's attention blocks and, as
`source_blocks`, the parent's checkpoint at `prefix_len` (resolved when the
child is first scheduled, so the parent may write it earlier in that step).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
from paged_harness import assert_logits_close, random_tokens

from hybridkv.kernels.attention import AttentionBatch
from hybridkv.kv_cache.specs import MambaSpec
from hybridkv.models.mamba_batch import MambaBatch

NAN = float("nan")


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """Hugging Face's forward over the whole sequence from scratch, no cache: [L, vocab]."""
    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float()


def hf_prefix_states(model, tokens: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Layer index -> (conv [C, d_conv - 1], ssm) after HF prefills `tokens` from zero."""
    with torch.no_grad():
        cache = model(torch.tensor([tokens]), use_cache=True).past_key_values
    states = {}
    for index, block_type in enumerate(model.config.layer_types):
        if block_type == "linear_attention":
            conv = cache.get_conv_state(index)[0, :, 1:]  # HF keeps d_conv inputs
            states[index] = (conv.float(), cache.get_recurrent_state(index)[0].float())
    return states


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding that re-runs HF's full no-cache forward for every new token."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        tokens.append(int(hf_logits(model, tokens)[-1].argmax()))
    return tokens[len(prompt):]


@dataclass
class SeqState:
    """One sequence's blocks: attention blocks in token order, live state, checkpoints."""

    live_block: int
    num_tokens: int = 0
    attn_blocks: list[int] = field(default_factory=list)
    checkpoints: dict[int, int] = field(default_factory=dict)  # boundary -> block id
    parent: tuple[str, int] | None = None  # (parent id, prefix_len) until first scheduled
    source: int | None = None


class HybridCache:
    """Attention K/V + Mamba state blocks bound to `runner`, with per-step batches."""

    def __init__(self, runner, *, block_size: int = 4, num_blocks: int = 400,
                 seed: int = 0) -> None:
        self.runner = runner
        self.block_size = block_size
        self.specs = runner.kv_cache_specs(block_size)
        self.caches = {name: self._allocate(spec, num_blocks) for name, spec in self.specs.items()}
        runner.bind_kv_cache(self.caches)
        self.free_blocks = list(range(1, num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.seqs: dict[str, SeqState] = {}

    def _allocate(self, spec, num_blocks: int) -> tuple[torch.Tensor, ...]:
        if isinstance(spec, MambaSpec):
            return tuple(torch.full((num_blocks, *shape), NAN) for shape in spec.shapes)
        shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
        k_cache, v_cache = torch.zeros(shape), torch.zeros(shape)
        k_cache[0], v_cache[0] = NAN, NAN
        return k_cache, v_cache

    def fork(self, child: str, parent: str, prefix_len: int) -> None:
        """`child` reuses `parent`'s first `prefix_len` tokens (a multiple of block_size)."""
        assert prefix_len % self.block_size == 0
        self.seqs[child] = SeqState(self.free_blocks.pop(), parent=(parent, prefix_len))

    def step(self, chunks: dict[str, list[int]], *,
             drop_state: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
        """Feed new tokens of several sequences in one batch; logits [n, vocab] per sequence.

        `drop_state`: sequences told to start from a zero state (a deliberate bug).
        """
        ids, positions, slots = [], [], []
        plan = []
        for seq_id, tokens in chunks.items():
            seq = self._resolve(seq_id)
            start, end = seq.num_tokens, seq.num_tokens + len(tokens)
            while len(seq.attn_blocks) * self.block_size < end:
                seq.attn_blocks.append(self.free_blocks.pop())
            ids += tokens
            positions += range(start, end)
            slots += [self._slot(seq, pos) for pos in range(start, end)]
            plan.append((seq, start, end, self._checkpoints(seq, start, end)))
        num_tokens = len(ids)
        attn = self._attention_batch(plan, torch.tensor(slots))
        mamba = self._mamba_batch(plan, drop_state, list(chunks))
        batches = {name: attn for name, spec in self.specs.items()
                   if not isinstance(spec, MambaSpec)}
        mamba_batches = {name: mamba for name, spec in self.specs.items()
                         if isinstance(spec, MambaSpec)}
        logits = self.runner.forward(torch.tensor(ids), torch.tensor(positions), batches,
                                     torch.arange(num_tokens), mamba_batches=mamba_batches)
        for seq, _, end, _ in plan:
            seq.num_tokens, seq.source = end, None
        assert logits.shape == (num_tokens, self.runner.vocab_size)
        return dict(zip(chunks, logits.split([len(t) for t in chunks.values()])))

    def _resolve(self, seq_id: str) -> SeqState:
        seq = self.seqs.get(seq_id)
        if seq is None:
            seq = self.seqs[seq_id] = SeqState(self.free_blocks.pop())
        if seq.parent is not None:
            parent_id, prefix_len = seq.parent
            parent = self.seqs[parent_id]
            seq.attn_blocks = parent.attn_blocks[:prefix_len // self.block_size]
            seq.source = parent.checkpoints[prefix_len]
            seq.num_tokens, seq.parent = prefix_len, None
        return seq

    def _checkpoints(self, seq: SeqState, start: int, end: int) -> list[tuple[int, int]]:
        """A new block for every boundary in (start, end]: (offset in the step, block id)."""
        out = []
        first = start // self.block_size + 1
        for boundary in range(first * self.block_size, end + 1, self.block_size):
            seq.checkpoints[boundary] = self.free_blocks.pop()
            out.append((boundary - start, seq.checkpoints[boundary]))
        return out

    def _slot(self, seq: SeqState, pos: int) -> int:
        return seq.attn_blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    def _attention_batch(self, plan, slots: torch.Tensor) -> AttentionBatch:
        counts = [end - start for _, start, end, _ in plan]
        query_start_loc = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()],
                                       dtype=torch.int32)
        seq_lens = torch.tensor([end for _, _, end, _ in plan], dtype=torch.int32)
        table = torch.zeros(len(plan), max(len(seq.attn_blocks) for seq, *_ in plan),
                            dtype=torch.int32)
        for row, (seq, *_) in enumerate(plan):
            table[row, :len(seq.attn_blocks)] = torch.tensor(seq.attn_blocks, dtype=torch.int32)
        return AttentionBatch(query_start_loc, seq_lens, table, slots)

    def _mamba_batch(self, plan, drop_state: frozenset[str], seq_ids: list[str]) -> MambaBatch:
        starts = [0]
        for _, start, end, _ in plan:
            starts.append(starts[-1] + end - start)
        dropped = [seq_id in drop_state for seq_id in seq_ids]
        return MambaBatch(
            query_start_loc=starts,
            live_blocks=[seq.live_block for seq, *_ in plan],
            source_blocks=[None if drop else seq.source for drop, (seq, *_) in zip(dropped, plan)],
            has_initial_state=[start > 0 and not drop
                               for drop, (_, start, _, _) in zip(dropped, plan)],
            checkpoints=[ckpts for *_, ckpts in plan])

    # ------------------------------------------------------------------ state access
    def checkpoint_state(self, seq_id: str, boundary: int, name: str) -> tuple[torch.Tensor, ...]:
        """The (conv, ssm) state layer `name` wrote after `boundary` tokens of `seq_id`."""
        block = self.seqs[seq_id].checkpoints[boundary]
        return tuple(view[block] for view in self.caches[name])

    def live_state(self, seq_id: str, name: str) -> tuple[torch.Tensor, ...]:
        """The (conv, ssm) state of layer `name` after every token fed so far."""
        block = self.seqs[seq_id].live_block
        return tuple(view[block] for view in self.caches[name])


def run_chunks(runner, tokens: list[int], chunk_sizes: list[int], *,
               block_size: int = 4) -> tuple[torch.Tensor, HybridCache]:
    """Prefill in chunks of `chunk_sizes`, then one token per step; logits [L, vocab]."""
    cache = HybridCache(runner, block_size=block_size)
    rows, start = [], 0
    for size in [*chunk_sizes, *[1] * (len(tokens) - sum(chunk_sizes))]:
        rows.append(cache.step({"a": tokens[start:start + size]})["a"])
        start += size
    return torch.cat(rows), cache


def greedy_generate(runner, prompt: list[int], max_new_tokens: int,
                    first_chunk: int) -> list[int]:
    """Greedy decoding with the runner: two prefill chunks, then one token per step."""
    cache = HybridCache(runner)
    cache.step({"a": prompt[:first_chunk]})
    logits = cache.step({"a": prompt[first_chunk:]})["a"]
    output = [int(logits[-1].argmax())]
    while len(output) < max_new_tokens:
        output.append(int(cache.step({"a": output[-1:]})["a"][-1].argmax()))
    return output



# ------------------------------------------------------------------ checks shared by families
def mamba_layer_names(runner) -> dict[int, str]:
    """Decoder index -> Mamba layer name."""
    return {index: layer.name for index, layer in runner.mamba_layers.items()}


def assert_state_close(ours: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> None:
    """Conv and SSM states equal to float32 precision."""
    for mine, theirs in zip(ours, ref, strict=True):
        assert not torch.isnan(mine).any(), "state block never written"
        atol = 1e-5 * max(1.0, theirs.abs().max().item())
        torch.testing.assert_close(mine, theirs.reshape(mine.shape), rtol=0.0, atol=atol)


def check_chunked_prefill_and_decode(model, runner, *, length: int = 120,
                                     chunk_sizes: tuple[int, ...] = (37, 5, 30, 40),
                                     boundaries: tuple[int, ...] = (8, 40, 72, 116)) -> None:
    """Uneven chunks (ends 37, 42 off and 72, 112 on block boundaries) then decode: HF logits;
    checkpoints at boundaries inside chunks, at chunk ends and from decode steps hold the
    state HF reaches after exactly that prefix."""
    tokens = random_tokens(length, vocab_size=runner.vocab_size, seed=11)
    ours, cache = run_chunks(runner, tokens, list(chunk_sizes))
    assert_logits_close(ours, hf_logits(model, tokens))
    names = mamba_layer_names(runner)
    for boundary in boundaries:
        ref = hf_prefix_states(model, tokens[:boundary])
        assert set(ref) == set(names)
        for index, name in names.items():
            assert_state_close(cache.checkpoint_state("a", boundary, name), ref[index])
    ref = hf_prefix_states(model, tokens)
    for index, name in names.items():
        assert_state_close(cache.live_state("a", name), ref[index])


def check_checkpoint_equals_own_prefix_run(model, runner) -> None:
    """A checkpoint written mid-chunk equals the live state of a run over exactly that prefix."""
    tokens = random_tokens(30, vocab_size=runner.vocab_size, seed=12)
    long_run = HybridCache(runner)
    long_run.step({"a": tokens[:3]})
    long_run.step({"a": tokens[3:]})  # boundaries 4, 8, ..., 28 at offsets 1, 5, ..., 25
    names = mamba_layer_names(runner).values()
    checkpoints = {name: long_run.checkpoint_state("a", 20, name) for name in names}
    prefix_run = HybridCache(runner, seed=1)  # binds new memory: long_run's stays as it was
    prefix_run.step({"a": tokens[:17]})
    prefix_run.step({"a": tokens[17:20]})
    for name in names:
        assert_state_close(checkpoints[name], prefix_run.live_state("a", name))


def check_resume_from_checkpoint(model, runner) -> None:
    """A second sequence starting from the first one's checkpoint (prefix reuse) gets HF's
    logits for its own continuation; started from a zero state instead, it does not."""
    a = random_tokens(40, vocab_size=runner.vocab_size, seed=13)
    b = a[:20] + random_tokens(22, vocab_size=runner.vocab_size, seed=14)
    ref = hf_logits(model, b)[20:]
    for drop in (False, True):
        cache = HybridCache(runner)
        cache.step({"a": a[:23]})
        cache.step({"a": a[23:]})
        cache.fork("b", "a", 20)
        dropped = frozenset({"b"} if drop else ())
        rows = [cache.step({"b": b[20:39]}, drop_state=dropped)["b"]]
        rows += [cache.step({"b": [token]})["b"] for token in b[39:]]
        ours = torch.cat(rows)
        if drop:  # the slow decay makes a lost state visible in the logits
            assert (ours - ref).abs().max() > 0.05 * ref.abs().max()
        else:
            assert_logits_close(ours, ref)


def check_same_step_checkpoint_read(model, runner) -> None:
    """A later sequence of a batch reads the checkpoint an earlier one writes in that step,
    in a prefill step and in a step of single tokens (no batched decode shortcut then)."""
    a = random_tokens(34, vocab_size=runner.vocab_size, seed=15)
    b = a[:16] + random_tokens(12, vocab_size=runner.vocab_size, seed=16)
    c = a[:32] + random_tokens(3, vocab_size=runner.vocab_size, seed=17)
    cache = HybridCache(runner)
    cache.fork("b", "a", 16)
    out = cache.step({"a": a[:30], "b": b[16:25]})
    assert_logits_close(out["b"], hf_logits(model, b)[16:25])
    out = cache.step({"a": a[30:31], "b": b[25:26]})
    cache.fork("c", "a", 32)
    out = cache.step({"a": a[31:32], "c": c[32:33]})  # a writes the state at 32, c reads it
    assert_logits_close(out["a"], hf_logits(model, a)[31:32])
    assert_logits_close(out["c"], hf_logits(model, c)[32:33])
    out = cache.step({"c": c[33:35], "b": b[26:28]})
    assert_logits_close(out["c"], hf_logits(model, c)[33:35])
    assert_logits_close(out["b"], hf_logits(model, b)[26:28])


def run_schedule(runner, schedule: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Run batched steps (seq id -> new tokens); all logits of each sequence [L, vocab]."""
    cache = HybridCache(runner, block_size=8)
    rows: dict[str, list[torch.Tensor]] = {}
    for chunks in schedule:
        for seq_id, logits in cache.step(chunks).items():
            rows.setdefault(seq_id, []).append(logits)
    return {seq_id: torch.cat(parts) for seq_id, parts in rows.items()}


def check_mixed_batch(model, runner) -> None:
    """Two sequences in one batch (prefill next to decode, then batched decode) equal each
    run alone, and HF."""
    a = random_tokens(48, vocab_size=runner.vocab_size, seed=2)
    b = random_tokens(45, vocab_size=runner.vocab_size, seed=3)
    schedule = [{"a": a[:40]}, {"a": a[40:41], "b": b[:20]}, {"b": b[20:37], "a": a[41:42]}]
    schedule += [{"a": [a[pos]], "b": [b[pos - 5]]} for pos in range(42, 48)]
    schedule += [{"b": [b[pos]]} for pos in range(43, 45)]
    batched = run_schedule(runner, schedule)
    for seq_id, tokens in (("a", a), ("b", b)):
        alone = run_schedule(runner, [{seq_id: c[seq_id]} for c in schedule if seq_id in c])
        assert batched[seq_id].shape == (len(tokens), runner.vocab_size)
        assert_logits_close(batched[seq_id], alone[seq_id], tol=1e-5)
        assert_logits_close(batched[seq_id], hf_logits(model, tokens))


def check_greedy(model, runner, *, prompt_len: int = 45, max_new_tokens: int = 10) -> None:
    """Greedy tokens equal HF greedy re-running the full sequence for every token."""
    prompt = random_tokens(prompt_len, vocab_size=runner.vocab_size, seed=4)
    expected = hf_greedy(model, prompt, max_new_tokens)
    assert len(set(expected)) > 1
    assert greedy_generate(runner, prompt, max_new_tokens, prompt_len // 3) == expected


def check_long_prompt(model, runner, *, length: int = 330,
                      chunk_sizes: tuple[int, ...] = (130, 77, 119)) -> None:
    """A prompt of several hundred tokens in long chunks, then decode: HF logits."""
    tokens = random_tokens(length, vocab_size=runner.vocab_size, seed=18)
    ours, _ = run_chunks(runner, tokens, list(chunk_sizes), block_size=16)
    assert_logits_close(ours, hf_logits(model, tokens))


ALL_CHECKS = (check_chunked_prefill_and_decode, check_checkpoint_equals_own_prefix_run,
              check_resume_from_checkpoint, check_same_step_checkpoint_read, check_mixed_batch,
              check_greedy, check_long_prompt)
