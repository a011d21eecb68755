"""Instances with a real manager and scheduler, whose block events feed a PrefixIndex."""

from __future__ import annotations

import random

from hybridkv.engine.sampling import SamplingParams
from hybridkv.engine.scheduler import Scheduler, SeqState
from hybridkv.kv_cache.event_codec import decode_events, encode_events
from hybridkv.kv_cache.kv_cache_config import KVCacheConfig, KVCacheGroupSpec
from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.serving.router import CacheLayout, PrefixIndex

MAX_TOKENS = 12  # outputs are 1..MAX_TOKENS tokens
MAX_CHUNK = 64  # tokens per step


def make_config(specs, num_blocks: int) -> KVCacheConfig:
    return KVCacheConfig(num_blocks, [KVCacheGroupSpec([f"l{i}"], s)
                                      for i, s in enumerate(specs)])


def pool_for(specs, num_tokens: int, factor: float) -> int:
    """A pool `factor` times what one request of `num_tokens` tokens holds at most."""
    probe = KVCacheManager(make_config(specs, 10_000))
    need = probe.coordinator.max_blocks_held(num_tokens, MAX_CHUNK)
    return int(need * factor) + 1 + probe.pool.num_pinned


class Instance:
    """One serving instance's KV cache bookkeeping; its events go to `index`
    through the wire format (encode, then decode), batched per step."""

    def __init__(self, name: str, config: KVCacheConfig, index: PrefixIndex, *,
                 eviction_policy: str = "hybrid", hash_algo: str = "sha256",
                 max_num_batched_tokens: int = MAX_CHUNK) -> None:
        self.name = name
        self.kv = KVCacheManager(config, eviction_policy=eviction_policy, hash_algo=hash_algo)
        self.scheduler = Scheduler(self.kv, max_num_seqs=4,
                                   max_num_batched_tokens=max_num_batched_tokens)
        self.index = index
        self.pending: list = []
        self.kv.pool.subscribe(self.pending.append)
        index.add_instance(name)
        self.count = 0

    def flush(self) -> None:
        if self.pending:
            self.index.apply_events(self.name, decode_events(encode_events(self.pending)))
            self.pending.clear()

    def run(self, prompts, rng: random.Random, vocab: int, salts=None) -> list[list[int]]:
        """Serve `prompts` to completion (random outputs of 1-12 tokens)."""
        seqs = []
        for i, prompt in enumerate(prompts):
            self.count += 1
            salt = salts[i] if salts else None
            req = Request(f"{self.name}-{self.count}", prompt, cache_salt=salt)
            assert self.kv.can_fit(len(prompt) + MAX_TOKENS, MAX_CHUNK), len(prompt)
            seq = SeqState(req, SamplingParams(max_tokens=rng.randint(1, MAX_TOKENS)), i)
            seqs.append(seq)
            self.scheduler.add(seq)
        while self.scheduler.has_work():
            batch = self.scheduler.schedule()
            self.scheduler.finish_step(batch)
            for item in batch:
                if item.samples:
                    seq = item.seq
                    seq.request.append_output_token_ids(rng.randrange(vocab))
                    if seq.num_output_tokens >= seq.params.max_tokens:
                        self.scheduler.finish(seq, "length")
            self.flush()
        return [s.request.all_token_ids for s in seqs]

    def computed_tokens(self, prompt, salt=None) -> int:
        """The real manager's answer (its stats change, nothing else)."""
        return self.kv.get_computed_blocks(Request("probe", prompt, cache_salt=salt))[1]


def new_index(config: KVCacheConfig, hash_algo: str = "sha256", width: int = 64) -> PrefixIndex:
    return PrefixIndex(CacheLayout.from_config(config, hash_algo), width=width)


class PromptSource:
    """Prompts sharing prefixes: cuts of a few bases, continuations of earlier
    prompts (with their outputs), and fresh ones; small vocabulary."""

    def __init__(self, rng: random.Random, vocab: int = 5, max_len: int = 60) -> None:
        self.rng, self.vocab, self.max_len = rng, vocab, max_len
        self.bases = [self.tokens(max_len) for _ in range(3)]
        self.history: list[list[int]] = []

    @property
    def max_prompt(self) -> int:
        return 2 * self.max_len + 3

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def prompt(self) -> list[int]:
        rng = self.rng
        pick = rng.random()
        if pick < 0.45:
            out = rng.choice(self.bases)[:rng.randint(1, self.max_len)]
        elif pick < 0.8 and self.history:
            out = rng.choice(self.history)[:] + self.tokens(rng.randint(0, 20))
        else:
            out = self.tokens(rng.randint(1, self.max_len))
        out = out[:2 * self.max_len] + self.tokens(rng.randint(0, 3))  # <= max_prompt
        return out or self.tokens(1)

    def remember(self, token_lists) -> None:
        self.history.extend(token_lists)
        del self.history[:-30]
