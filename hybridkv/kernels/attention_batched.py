"""Batched dense attention for the torch path of `paged_attention`.

A step's queries are cut into tiles: one decode token, or up to `tile_size` rows of one
sequence's prefill. A tile sees sink keys `[0, num_sinks)` and one contiguous run of keys
`[first_key, end)`, `end` being one past its last query. Tiles of similar size form a group,
computed at once:

1. gather, per tile, the cache blocks holding its run (and sinks), padded to the group's widest
   tile: K/V `[num_tiles, num_slots, Hkv, D]`. Slots that hold no key of the tile are masked;
   those that may hold NaN (past the sequence end, padding) are also set to zero in K and V,
   since a masked weight is zero and zero times NaN is NaN. Slots before the window in its
   first block hold keys written earlier, so masking them is enough;
2. when every tile's run starts with the same cache blocks that all its queries see in full (a
   shared document under prefix caching), those blocks are gathered once and scored against all
   the group's queries together; only the rest is gathered per tile. Example: 32 decodes over a
   cached 2,048-token document each gather their own last few blocks, plus 128 shared blocks once;
3. scores, softcap, mask (none for decodes whose slots are all keys), then one softmax over both
   parts with optional sink logits, and the weighted sum. Prefill groups without softcap or sink
   logits use torch's fused `scaled_dot_product_attention` with an additive mask instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from hybridkv.kernels.attention import MaskRules

# A group's padded score tensor (tiles x q heads x queries x slots) stays under this many floats.
MAX_SCORE_ELEMENTS = 1 << 22
# A tile joins a group while padded work <= PADDING_RATIO * useful work + PADDING_SLACK.
PADDING_RATIO = 1.25
PADDING_SLACK = 1 << 14
# torch >= 2.5: scaled_dot_product_attention reads one kv head for its query group, no copies.
SDPA_HAS_GQA = torch.__version__ >= "2.5"


class Tile(NamedTuple):
    """Query rows `[row, row + num_queries)` of sequence `seq`, at positions from `first_pos`."""

    seq: int
    row: int
    num_queries: int
    first_pos: int
    first_key: int  # start of the key run; the run ends at first_pos + num_queries
    num_sinks: int  # sink keys [0, num_sinks) seen besides the run
    num_slots: int  # slots of the whole blocks holding the sinks and the run
    num_prefix_blocks: int  # leading blocks each query sees in full, all before first_pos

    @property
    def end(self) -> int:
        """One past the last query position (and the last key of the run)."""
        return self.first_pos + self.num_queries


class _RunLayout(NamedTuple):
    """Which cache slots a group's tiles read; depends on the tiles, not on the block table."""

    seq: torch.Tensor  # [N, 1] sequence of each tile
    columns: torch.Tensor  # [N, C] block-table columns gathered, in order
    positions: torch.Tensor  # [N, L] key position held by each slot
    valid: torch.Tensor | None  # [N, L] slot holds a key of the tile; None: every slot does
    stale: torch.Tensor | None  # flat indices into N * L of the slots that may hold NaN


class _RunKeys(NamedTuple):
    key: torch.Tensor  # [N, L, Hkv, D] float32, zero in stale slots
    value: torch.Tensor  # [N, L, Hkv, D]
    positions: torch.Tensor  # [N, L] key position held by each slot
    valid: torch.Tensor | None  # [N, L] slot holds a key of the tile; None: every slot does


def plan_tiles(starts: list[int], seq_lens: list[int], rules: MaskRules, tile_size: int,
               block_size: int) -> list[Tile]:
    """Tiles of at most `tile_size` queries covering every sequence's new tokens, in order.

    Example: `starts=[0, 300, 301]`, `seq_lens=[300, 40]`, tile 256 -> tiles of 256 and 44 rows
    for sequence 0, one decode row for sequence 1.
    """
    tiles = []
    for s, seq_len in enumerate(seq_lens):
        first_pos = seq_len - (starts[s + 1] - starts[s])
        for row in range(starts[s], starts[s + 1], tile_size):
            num_queries = min(tile_size, starts[s + 1] - row)
            tiles.append(_make_tile(s, row, num_queries, first_pos + row - starts[s], rules,
                                    block_size))
    return tiles


def _make_tile(seq, row, num_queries, pos, rules: MaskRules, block_size) -> Tile:
    first_key = rules.first_key(pos)
    num_sinks = rules.num_visible_sinks(first_key)
    last = pos + num_queries - 1
    num_blocks = -(-num_sinks // block_size) + last // block_size - first_key // block_size + 1
    num_prefix_blocks = pos // block_size if rules.first_key(last) == 0 else 0
    return Tile(seq, row, num_queries, pos, first_key, num_sinks, num_blocks * block_size,
                num_prefix_blocks)


def group_tiles(tiles: list[Tile], num_heads: int) -> list[list[Tile]]:
    """Tiles grouped by size so that padding each group to its largest tile wastes little.

    Largest first; a group closes when the next tile would push its padded work past
    `PADDING_RATIO` x its useful work (+ `PADDING_SLACK`) or its scores past `MAX_SCORE_ELEMENTS`.
    """
    groups: list[list[Tile]] = []
    useful = max_queries = max_slots = 0
    for tile in sorted(tiles, key=lambda t: (t.num_slots, t.num_queries), reverse=True):
        queries, slots = max(max_queries, tile.num_queries), max(max_slots, tile.num_slots)
        work = tile.num_queries * tile.num_slots
        padded = (len(groups[-1]) + 1 if groups else 1) * queries * slots
        if (groups and padded <= PADDING_RATIO * (useful + work) + PADDING_SLACK
                and padded * num_heads <= MAX_SCORE_ELEMENTS):
            groups[-1].append(tile)
            useful, max_queries, max_slots = useful + work, queries, slots
        else:
            groups.append([tile])
            useful, max_queries, max_slots = work, tile.num_queries, tile.num_slots
    return groups


def attend_group(query, k_cache, v_cache, block_table, tiles: list[Tile], rules: MaskRules,
                 sinks, out: torch.Tensor, memo: dict | None = None) -> None:
    """Attention of one group of tiles, written into `out` `[num_tokens, Hq, D]` in place.

    `memo`: a dict kept with the tiles, filled with what depends only on them, the rules and
    the block size (query rows, key layouts, masks), so that layers sharing the tiling reuse it.
    """
    # query: [num_tokens, Hq, D]; caches: [num_blocks, B, Hkv, D]; block_table: [S, max_blocks]
    memo = {} if memo is None else memo
    if "rows" not in memo:
        memo["rows"] = _query_rows(tiles, query.device)
    rows, q_pos, real = memo["rows"]  # [N, Q] each
    fused = rules.softcap is None and sinks is None and rows.shape[1] > 1
    if "plain" not in memo:
        memo["plain"] = real is None and _plain_causal(tiles, rules)
    causal = fused and memo["plain"]
    shared = 0 if fused else _shared_prefix_blocks(block_table, tiles)
    if shared not in memo:
        layout = _run_layout(tiles, shared * k_cache.shape[1], k_cache.shape[1], query.device)
        if causal:  # slot j holds position j, and query i sees slots 0..i: no mask at all
            memo[shared] = layout, None
        elif fused:  # an additive bias [N, 1, Q, L]
            memo[shared] = layout, _bias(q_pos, layout, rules,
                                         _num_open_slots(tiles, k_cache.shape[1]))
        else:
            memo[shared] = layout, _mask(q_pos, layout, rules)  # [N, Q, L] or None
    layout, mask = memo[shared]
    keys = _gather_run(k_cache, v_cache, block_table, layout)
    q = query[rows].float()  # [N, Q, Hq, D]
    if fused:
        result = _fused_attention(q, keys, mask, rules.scale, causal)
    else:
        prefix = None  # the shared blocks' K/V [1, P * B, Hkv, D], gathered once
        if shared:
            ids = block_table[tiles[0].seq, :shared].long()  # [P]
            prefix = _gather_blocks(k_cache, v_cache, ids[None])
        result = _dense_attention(q, keys, mask, prefix, rules, sinks)
    if real is None:
        out[rows.flatten()] = result.flatten(0, 1).to(out.dtype)
    else:
        out[rows[real]] = result[real].to(out.dtype)


def _plain_causal(tiles: list[Tile], rules: MaskRules) -> bool:
    """Whether every tile starts its sequence (position 0, no cached keys before it) and its
    last query still sees key 0 (no window or chunk cut, no sinks): each query then sees
    exactly the keys up to its own, which the fused kernel's causal mode computes without
    a mask, skipping the key blocks past the diagonal."""
    return all(t.first_pos == 0 and t.num_sinks == 0 and rules.first_key(t.end - 1) == 0
               for t in tiles)


def _query_rows(tiles: list[Tile], device):
    # -> query rows and positions [N, Q] (padding repeats the tile's last query), and which
    # entries are real queries [N, Q] (None when every tile has Q queries)
    meta = torch.tensor([[t.row, t.num_queries, t.first_pos] for t in tiles], device=device)
    row, count, first_pos = meta.unbind(1)  # [N] each
    max_queries = max(t.num_queries for t in tiles)
    step = torch.arange(max_queries, device=device)  # [Q]
    if all(t.num_queries == max_queries for t in tiles):
        return row[:, None] + step, first_pos[:, None] + step, None
    offset = torch.minimum(step, count[:, None] - 1)  # [N, Q]
    return row[:, None] + offset, first_pos[:, None] + offset, offset == step


def _shared_prefix_blocks(block_table, tiles: list[Tile]) -> int:
    # leading blocks that every query of the group sees in full and all its tables share
    limit = min(t.num_prefix_blocks for t in tiles)
    seqs = sorted({t.seq for t in tiles})
    if limit == 0 or len(seqs) == 1:
        return limit
    table = block_table[seqs, :limit]  # [S, limit]
    same = (table == table[:1]).all(0)  # [limit]
    return int(same.cumprod(0).sum())


def _run_layout(tiles: list[Tile], run_floor: int, block_size: int, device) -> _RunLayout:
    # each tile's sinks and the part of its run from run_floor on, in whole blocks
    starts = [max(t.first_key, run_floor) for t in tiles]
    sink_blocks = -(-max(t.num_sinks for t in tiles) // block_size)
    run_blocks = max((t.end - 1) // block_size - s // block_size + 1 for t, s in zip(tiles, starts))
    meta = torch.tensor([[t.seq, s, t.end, t.num_sinks] for t, s in zip(tiles, starts)],
                        device=device)
    seq, start, end, num_sinks = meta.unbind(1)  # [N] each
    columns = _block_columns(start, end, block_size, sink_blocks, run_blocks)  # [N, C]
    slot = torch.arange((sink_blocks + run_blocks) * block_size, device=device)  # [L]
    positions, valid = _slot_positions(slot, start, end, num_sinks, sink_blocks * block_size,
                                       block_size)  # [N, L] each
    num_keys = sum(t.num_sinks + t.end - s for t, s in zip(tiles, starts))
    if num_keys == valid.numel():
        return _RunLayout(seq[:, None], columns, positions, None, None)
    # slots before the run's start in its first block hold keys written earlier (finite):
    # masking them is enough. Only the others (past the end, sink padding) may hold NaN.
    written = positions < start[:, None]
    if sink_blocks:
        written &= slot >= sink_blocks * block_size
    stale = (~valid & ~written).flatten().nonzero().squeeze(1)  # indices into N * L
    return _RunLayout(seq[:, None], columns, positions, valid, stale if len(stale) else None)


def _gather_run(k_cache, v_cache, block_table, layout: _RunLayout) -> _RunKeys:
    # the K/V of a layout's slots, zero where a slot may hold NaN (masked either way)
    key, value = _gather_blocks(k_cache, v_cache,
                                block_table[layout.seq, layout.columns].long())
    if layout.stale is not None:
        for gathered in (key, value):  # [N * L, Hkv * D] views
            gathered.view(-1, gathered.shape[2] * gathered.shape[3]).index_fill_(
                0, layout.stale, 0.0)
    return _RunKeys(key, value, layout.positions, layout.valid)


def _block_columns(start, end, block_size, num_sink_blocks, num_run_blocks) -> torch.Tensor:
    # -> [N, sink blocks + run blocks] block-table columns; short runs repeat their last block
    first_block, last_block = start // block_size, (end - 1) // block_size  # [N] each
    run = torch.arange(num_run_blocks, device=start.device)
    run = torch.minimum(first_block[:, None] + run, last_block[:, None])  # [N, R]
    if num_sink_blocks == 0:
        return run
    sink = torch.arange(num_sink_blocks, device=start.device).expand(run.shape[0], -1)
    return torch.cat([sink, run], dim=1)


def _gather_blocks(k_cache, v_cache, block_ids) -> tuple[torch.Tensor, torch.Tensor]:
    # block_ids: [N, C] -> K, V [N, C * B, Hkv, D] float32 (whole blocks, in table order), two
    # halves of one allocation: freeing one large buffer, not two, lets the C allocator keep the
    # memory for the next call instead of returning it and faulting it back in
    ids = block_ids.flatten()  # [N * C]
    both = k_cache.new_empty((2, ids.numel()) + k_cache.shape[1:], dtype=torch.float32)
    for half, cache in zip(both, (k_cache, v_cache)):
        if cache.dtype == torch.float32:
            torch.index_select(cache, 0, ids, out=half)
        else:
            half.copy_(cache.index_select(0, ids))
    both = both.view(2, block_ids.shape[0], -1, k_cache.shape[2], k_cache.shape[3])
    return both[0], both[1]


def _slot_positions(slot, start, end, num_sinks, sink_slots, block_size):
    # slot: [L] -> key position held by each slot and whether it is a key of the tile, [N, L]
    # each; slots of repeated blocks past the run get positions >= end, hence invalid
    run_pos = (start // block_size * block_size)[:, None] + (slot - sink_slots)  # [N, L]
    in_run = (run_pos >= start[:, None]) & (run_pos < end[:, None])  # [N, L]
    if sink_slots == 0:
        return run_pos, in_run
    is_sink_slot = slot < sink_slots  # [L]
    positions = torch.where(is_sink_slot, slot, run_pos)  # [N, L]
    return positions, torch.where(is_sink_slot, slot < num_sinks[:, None], in_run)


def _mask(q_pos, layout: _RunLayout, rules: MaskRules) -> torch.Tensor | None:
    # q_pos: [N, Q] -> [N, Q, L]; a lone query sees every key of its tile, so only validity counts
    if q_pos.shape[1] == 1:
        return None if layout.valid is None else layout.valid[:, None]
    allowed = rules.allows(q_pos[:, :, None], layout.positions[:, None, :])  # [N, Q, L]
    return allowed if layout.valid is None else allowed & layout.valid[:, None]


def _num_open_slots(tiles: list[Tile], block_size: int) -> int:
    # leading slots of a run layout (from key 0, no sinks) that every query of every tile sees:
    # the blocks each tile's queries see in full. Example: one tile of 32 queries after a
    # cached 2,048-token document -> 2,048 (only the last 32 slots need a mask)
    return min(t.num_prefix_blocks for t in tiles) * block_size


def _bias(q_pos, layout: _RunLayout, rules: MaskRules, num_open: int) -> torch.Tensor:
    # q_pos: [N, Q] -> additive mask [N, 1, Q, L], 0 where a query sees a slot, -inf elsewhere;
    # the first num_open slots are seen by every query (and hold its keys), so they stay 0
    # and only the rest is compared
    num_tiles, num_queries = q_pos.shape
    positions = layout.positions[:, None, num_open:]  # [N, 1, L - open]
    allowed = rules.allows(q_pos[:, :, None], positions)  # [N, Q, L - open]
    if layout.valid is not None:
        allowed &= layout.valid[:, None, num_open:]
    bias = torch.zeros(num_tiles, 1, num_queries, layout.positions.shape[1],
                       device=q_pos.device)
    bias[:, 0, :, num_open:].masked_fill_(~allowed, float("-inf"))
    return bias


def _fused_attention(q, keys: _RunKeys, bias, scale: float, causal: bool = False
                     ) -> torch.Tensor:
    # q: [N, Q, Hq, D]; keys: [N, L, Hkv, D]; bias: [N, 1, Q, L] float32 or None with `causal`
    # (query i sees slots 0..i, L >= Q) -> [N, Q, Hq, D]
    key, value = keys.key.transpose(1, 2), keys.value.transpose(1, 2)  # [N, Hkv, L, D] views
    group = q.shape[2] // key.shape[1]
    options = {}
    if group > 1 and SDPA_HAS_GQA:
        options["enable_gqa"] = True
    elif group > 1:
        key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), key, value, attn_mask=bias,
                                         is_causal=causal, scale=scale,
                                         **options)  # [N, Hq, Q, D]
    return out.transpose(1, 2)


def _dense_attention(q, keys: _RunKeys, mask, prefix, rules: MaskRules, sinks) -> torch.Tensor:
    # q: [N, Q, Hq, D]; mask: [N, Q, L] or None; prefix: shared K/V [1, P, Hkv, D] or None
    num_tiles, num_queries, num_q_heads, head_dim = q.shape
    num_kv_heads = keys.key.shape[2]
    group = num_q_heads // num_kv_heads
    shape = (num_kv_heads, num_tiles, group, num_queries, -1)  # scores: [Hkv, N, G, Q, keys]
    q = q.view(num_tiles, num_queries, num_kv_heads, group, head_dim)
    q = q.permute(2, 0, 3, 1, 4).contiguous().view(num_kv_heads, num_tiles, -1, head_dim)
    scores = [_scores(q, keys.key, rules).view(shape)]
    if mask is not None:
        scores[0].masked_fill_(~mask[None, :, None], float("-inf"))
    if prefix is not None:  # every query of the group against the shared blocks at once
        all_queries = q.view(num_kv_heads, 1, -1, head_dim)  # [Hkv, 1, N * G * Q, D]
        scores.append(_scores(all_queries, prefix[0], rules).view(shape))
    total = _exponentiate(scores, sinks)  # [Hkv, N, G, Q, 1]
    weights = scores[0].view(num_kv_heads, num_tiles, group * num_queries, -1)
    out = _matmul_per_head(weights, keys.value.permute(2, 0, 1, 3))  # [Hkv, N, G * Q, D]
    if prefix is not None:
        weights = scores[1].view(num_kv_heads, 1, -1, prefix[1].shape[1])  # [Hkv, 1, N*G*Q, P]
        out += _matmul_per_head(weights, prefix[1].permute(2, 0, 1, 3)).view(out.shape)
    out = out.view(shape[:-1] + (head_dim,)) / total  # [Hkv, N, G, Q, D]
    return out.permute(1, 3, 0, 2, 4).reshape(num_tiles, num_queries, num_q_heads, head_dim)


def _scores(q, key, rules: MaskRules) -> torch.Tensor:
    # q: [Hkv, N, R, D]; key: [N, L, Hkv, D] -> scaled (and softcapped) scores [Hkv, N, R, L]
    scores = _matmul_per_head(q, key.permute(2, 0, 3, 1)).mul_(rules.scale)
    if rules.softcap is not None:
        scores.div_(rules.softcap).tanh_().mul_(rules.softcap)
    return scores


def _matmul_per_head(a, b) -> torch.Tensor:
    # a: [Hkv, N, R, X] contiguous; b: [Hkv, N, X, Y], a strided view of a [N, ., Hkv, D] gather
    # -> a @ b [Hkv, N, R, Y], one bmm per kv head so that b is read in place, never copied
    out = a.new_empty(a.shape[:-1] + b.shape[-1:])
    for head in range(a.shape[0]):
        torch.bmm(a[head], b[head], out=out[head])
    return out


def _exponentiate(parts: list[torch.Tensor], sinks) -> torch.Tensor:
    # parts: scores [Hkv, N, G, Q, L_i] of one softmax split by columns; in place each becomes
    # exp(score - row max). Returns the softmax denominator [Hkv, N, G, Q, 1]; sinks: [Hkv * G]
    # logits of a virtual key whose value is zero, so they only join the denominator
    row_max = parts[0].amax(-1, keepdim=True)
    for part in parts[1:]:
        row_max = torch.maximum(row_max, part.amax(-1, keepdim=True))
    if sinks is not None:
        sink = sinks.float().view(parts[0].shape[0], 1, parts[0].shape[2], 1, 1)
        row_max = torch.maximum(row_max, sink)
    total = sum(part.sub_(row_max).exp_().sum(-1, keepdim=True) for part in parts)
    if sinks is not None:
        total = total + (sink - row_max).exp()
    return total
