"""A shadow of what every block holds, kept independently of the manager.

The manager hands out block ids; the shadow remembers, from the tokens alone,
what a model step would have written into each of them. A step that computes
tokens [start, end) of a request writes, in every group, the blocks at the
positions those tokens fall in (attention: the KV of tokens [p*B, (p+1)*B)
of that request's prefix; Mamba: the state after each checkpointed boundary
and the running state in the live block). Nothing here reads block hashes:
the content of a block is the group, the request's cache_salt and lora_name
and the explicit token tuple of the prefix up to the last token written.

The checks a correct manager must pass:

- `record_step`: every block the step's tokens read is listed and holds this
  request's prefix; every block it writes is listed and no sink, and held by
  no other request unless it holds that data already (a request that takes
  a cached block for data it recomputes rewrites the same values); Mamba
  reads its start state from the hit source or the live block, and gets a
  checkpoint at every boundary its retention policy keeps.
- `check_request`: every non-null block in a request's table holds THAT
  request's tokens at that position, and nothing the next token reads was
  released.
- `check_hit`: the blocks of a cache hit hold the querying request's tokens
  (stale or wrong reuse fails here) and cover what its next token reads.
- `check_cached_map`: every hash-map entry keys a block whose recorded
  content hashes (by `compute_block_hashes`) to that key.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

from hybridkv.kv_cache.block_pool import BlockPool
from hybridkv.kv_cache.hashing import compute_block_hashes
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import (
    ChunkedLocalAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)


class ShadowViolation(AssertionError):
    """The manager's block tables disagree with the shadow of the block contents."""


class Content(NamedTuple):
    """What one block holds: KV of a prefix's last block, or a state after a prefix."""

    group: int
    kind: str  # "kv" or "state"
    cache_salt: str | bytes | None
    lora_name: str | None
    tokens: tuple[int, ...]  # the prefix up to the last token written into the block


def _extends(have: Content | None, want: Content, block_size: int) -> bool:
    """Whether a block holding `have` holds `want`'s KV already: the same group,
    salt and LoRA, the same block position, and a prefix `want`'s tokens begin
    (a request recomputing data a shared cached block holds rewrites identical
    values)."""
    n = len(want.tokens)
    return (have is not None and want.kind == "kv" and have.kind == "kv" and n > 0
            and have[:4] == want[:4] and len(have.tokens) >= n
            and (len(have.tokens) - 1) // block_size == (n - 1) // block_size
            and have.tokens[:n] == want.tokens)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def positions_read(spec: KVCacheSpec, start: int, end: int) -> set[int]:
    """Block positions that tokens [start, end) of an attention layer read.

    Restated from the spec's raw fields: full attention reads every earlier
    token; a window W reads tokens t-W+1..t plus the first `num_sink_tokens`;
    a chunk C reads from the start of the token's chunk.

    >>> sorted(positions_read(SlidingWindowSpec(4, sliding_window=6), 9, 11))
    [1, 2]
    """
    bs, last = spec.block_size, _ceil_div(end, spec.block_size)
    if isinstance(spec, SlidingWindowSpec):
        first = max(start - spec.sliding_window + 1, 0) // bs
        sinks = range(_ceil_div(min(spec.num_sink_tokens, end), bs))
        return set(range(first, last)).union(sinks)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        chunk = spec.attention_chunk_size
        return set(range(start // chunk * chunk // bs, last))
    return set(range(last))


def kept_boundaries(spec: MambaSpec, num_prompt_tokens: int, start: int, end: int) -> list[int]:
    """Boundaries j (the state after j*B tokens) in (start, end] that must get a
    checkpoint: every `checkpoint_interval`-th one plus the last inside the prompt."""
    bs, every = spec.block_size, spec.checkpoint_interval
    prompt_end = num_prompt_tokens // bs
    return [j for j in range(start // bs + 1, end // bs + 1)
            if j % every == 0 or j == prompt_end]


class ShadowCache:
    """Block id -> `Content`, updated by the steps a driver runs.

    Args:
        specs: one spec per group, in group order.
        null_block_id: the id standing where a group needs no block.
        hash_algo, hash_block_size: how the manager keys its hash map
            (for `check_cached_map`).
        enable_caching: whether Mamba checkpoints are required.
    """

    def __init__(self, specs: Sequence[KVCacheSpec], null_block_id: int, hash_algo: str,
                 hash_block_size: int, enable_caching: bool = True) -> None:
        self.specs = list(specs)
        self.null = null_block_id
        self.hash_algo = hash_algo
        self.hash_block_size = hash_block_size
        self.enable_caching = enable_caching
        self.content: dict[int, Content] = {}
        self._hash_memo: dict[Content, bytes] = {}

    def expected(self, g: int, request: Request, num_tokens: int) -> Content:
        """The content group `g` holds for `request`'s first `num_tokens` tokens."""
        kind = "state" if isinstance(self.specs[g], MambaSpec) else "kv"
        return Content(g, kind, request.cache_salt, request.lora_name,
                       tuple(request.all_token_ids[:num_tokens]))

    def _expect(self, block_id: int, want: Content, what: str) -> None:
        have = self.content.get(block_id)
        if have != want and not _extends(have, want, self.specs[want.group].block_size):
            raise ShadowViolation(
                f"{what}: block {block_id} holds {_describe(have)}, expected {_describe(want)}")

    # ---- a model step --------------------------------------------------------

    def record_step(self, request: Request, block_ids: Sequence[Sequence[int]], start: int,
                    end: int, holders: Mapping[int, int],
                    sink_ids: Collection[int]) -> list[int]:
        """Check what tokens [start, end) of `request` read, then record what they
        write; return the written block ids.

        `block_ids` is the request's table per group after the allocation;
        `holders` counts, per block id, the running requests listing it.
        """
        writes: list[tuple[int, Content]] = []
        for g, ids in enumerate(block_ids):
            spec = self.specs[g]
            if isinstance(spec, MambaSpec):
                writes += self._mamba_step(g, spec, request, ids, start, end)
            else:
                writes += self._attention_step(g, spec, request, ids, start, end)
        rid = request.request_id
        extends = [_extends(self.content.get(block_id), content,
                            self.specs[content.group].block_size)
                   for block_id, content in writes]
        for (block_id, content), same in zip(writes, extends):
            if block_id in sink_ids or (holders.get(block_id, 0) != 1 and not same):
                raise ShadowViolation(
                    f"{rid} writes {_describe(content)} into block {block_id}, which "
                    f"{holders.get(block_id, 0)} running requests list (or a sink)")
        for (block_id, content), same in zip(writes, extends):
            if not same:
                self.content[block_id] = content
        return [block_id for block_id, _ in writes]

    def _attention_step(self, g: int, spec: KVCacheSpec, request: Request, ids: Sequence[int],
                        start: int, end: int) -> list[tuple[int, Content]]:
        bs, rid = spec.block_size, request.request_id
        for p in sorted(positions_read(spec, start, end)):
            if p >= len(ids) or ids[p] == self.null:
                raise ShadowViolation(f"{rid} group {g}: tokens {start}..{end} read block "
                                      f"position {p}, which is not listed in {list(ids)}")
            if p * bs < start:  # written by an earlier step (or adopted from a hit)
                self._expect(ids[p], self.expected(g, request, min((p + 1) * bs, start)),
                             f"{rid} group {g} position {p} read at {start}")
        return [(ids[p], self.expected(g, request, min((p + 1) * bs, end)))
                for p in range(start // bs, _ceil_div(end, bs))]

    def _mamba_step(self, g: int, spec: MambaSpec, request: Request, ids: Sequence[int],
                    start: int, end: int) -> list[tuple[int, Content]]:
        bs, rid, null = spec.block_size, request.request_id, self.null
        if not ids or ids[-1] == null:
            raise ShadowViolation(f"{rid} group {g}: no live state block in {list(ids)}")
        if start:  # the start state: a hit's source block, else the live block
            source = ids[start // bs - 1] if start % bs == 0 else null
            source = ids[-1] if source == null else source
            self._expect(source, self.expected(g, request, start),
                         f"{rid} group {g} start state at {start}")
        required = kept_boundaries(spec, request.num_prompt_tokens, start, end) \
            if self.enable_caching else []
        missing = [j for j in required if ids[j - 1] == null]
        if missing:
            raise ShadowViolation(f"{rid} group {g}: no checkpoint block for boundaries "
                                  f"{missing} (x{bs} tokens) in {list(ids)}")
        writes = [(ids[j - 1], self.expected(g, request, j * bs))
                  for j in range(start // bs + 1, end // bs + 1) if ids[j - 1] != null]
        return writes + [(ids[-1], self.expected(g, request, end))]

    # ---- standing checks -------------------------------------------------------

    def check_request(self, request: Request, block_ids: Sequence[Sequence[int]],
                      num_written: int) -> None:
        """Every listed block holds this request's data at its position; nothing
        token `num_written` (the next one) reads was released."""
        rid = request.request_id
        for g, ids in enumerate(block_ids):
            spec = self.specs[g]
            bs = spec.block_size
            if isinstance(spec, MambaSpec):
                for i, block_id in enumerate(ids[:-1]):
                    if block_id != self.null and (i + 1) * bs <= num_written:
                        self._expect(block_id, self.expected(g, request, (i + 1) * bs),
                                     f"{rid} group {g} checkpoint {i}")
                if num_written and ids:
                    self._expect(ids[-1], self.expected(g, request, num_written),
                                 f"{rid} group {g} live state")
                continue
            for p, block_id in enumerate(ids):
                if block_id != self.null and p * bs < num_written:
                    self._expect(block_id, self.expected(g, request, min((p + 1) * bs,
                                                                         num_written)),
                                 f"{rid} group {g} position {p}")
            needed = positions_read(spec, num_written, num_written + 1)
            lost = [p for p in needed if p * bs < num_written
                    and (p >= len(ids) or ids[p] == self.null)]
            if lost:
                raise ShadowViolation(f"{rid} group {g}: positions {sorted(lost)} that token "
                                      f"{num_written} reads were released: {list(ids)}")

    def check_hit(self, request: Request, block_ids: Sequence[Sequence[int]],
                  length: int) -> None:
        """The hit's blocks hold `request`'s own tokens and cover what token
        `length` reads (the reuse rule, restated)."""
        rid = request.request_id
        for g, ids in enumerate(block_ids):
            spec = self.specs[g]
            bs = spec.block_size
            if len(ids) * bs != length:
                raise ShadowViolation(f"{rid} group {g}: a hit of {length} tokens lists "
                                      f"{len(ids)} blocks of {bs}")
            for p, block_id in enumerate(ids):
                if block_id != self.null:
                    self._expect(block_id, self.expected(g, request, (p + 1) * bs),
                                 f"{rid} group {g} hit position {p}")
            if isinstance(spec, MambaSpec):
                needed = {len(ids) - 1} if length else set()
            else:
                needed = {p for p in positions_read(spec, length, length + 1) if p * bs < length}
            if any(ids[p] == self.null for p in needed):
                raise ShadowViolation(f"{rid} group {g}: a hit of {length} tokens lacks block "
                                      f"positions {sorted(needed)} the next token reads: "
                                      f"{list(ids)}")

    def check_cached_map(self, pool: BlockPool) -> None:
        """Every (group, hash) -> block entry keys the block's recorded content."""
        for g, table in enumerate(pool.cached):
            bs = self.specs[g].block_size
            for block_hash, block in table.items():
                content = self.content.get(block.block_id)
                if content is None or content.group != g or len(content.tokens) % bs \
                        or not content.tokens:
                    raise ShadowViolation(f"group {g}: cached block {block.block_id} holds "
                                          f"{_describe(content)}, not a full block")
                if self._hash(content) != block_hash:
                    raise ShadowViolation(f"group {g}: block {block.block_id} is cached under "
                                          f"a hash that is not its content's "
                                          f"{_describe(content)}")

    def _hash(self, content: Content) -> bytes:
        key = self._hash_memo.get(content)
        if key is None:
            key = compute_block_hashes(list(content.tokens), self.hash_block_size,
                                       hash_algo=self.hash_algo, cache_salt=content.cache_salt,
                                       lora_name=content.lora_name)[-1]
            self._hash_memo[content] = key
        return key


def _describe(content: Content | None) -> str:
    if content is None:
        return "nothing written"
    tokens = content.tokens
    shown = f"{list(tokens[:6])}...{list(tokens[-4:])}" if len(tokens) > 10 else list(tokens)
    keys = "".join(f" {name}={value!r}" for name, value in
                   (("salt", content.cache_salt), ("lora", content.lora_name)) if value)
    return f"{content.kind} of group {content.group} after {len(tokens)} tokens {shown}{keys}"
