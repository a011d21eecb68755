"""Write at compute time: what one instance computes, the others sharing its store load.

Write-behind stores a block only when the pool evicts it, so a block this
instance still holds is invisible to every other instance using the same
store. For a store several instances share (`KVStore.shared`: Redis, a
`file://` directory marked `?shared=1`) the tier also writes, once each
step has computed them, the blocks a hit at a prompt's stops needs under
the reuse rules:

- every full-attention block of the prompt (any prefix of a hit is a hit);
- per sliding-window, chunked-local or Mamba group, the blocks a hit
  stopping at each aligned boundary of the prompt's last TAIL_TOKENS needs
  (where a repeat of the prompt, or a new question after it, stops), and at
  the request's junction (where it left the cached prefix it reused): the
  window before the stop (and the sink blocks), the chunk up to it, the
  Mamba state at it.

Each block is written once: a set of the hashes this instance wrote (or
queued) is checked first, and the writer asks the store which keys it
already holds before putting (another instance may have written them).
The copies are bounded per step (`step_bytes`); what is left waits for the
next steps while the pool still holds it, and the writer's bounded queue
drops (and counts) what overflows, so a step never waits on the store.

A block is read out only after a step (`after_step`): every block the pool
maps under a hash then holds that hash's data (blocks are cached when a
step is scheduled to compute them, and data is lost only by being taken for
new data, which drops the hash).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from hybridkv.kv_cache.managers.base import SingleTypeManager
from hybridkv.kv_cache.request import Request
from hybridkv.kv_cache.specs import ChunkedLocalAttentionSpec, MambaSpec, SlidingWindowSpec
from hybridkv.store.selection import TAIL_TOKENS, new_tail_set

DEFAULT_STEP_BYTES = 8 << 20  # block data copied out per step at most
MAX_WATCHED = 1024  # requests whose blocks are awaited at once (the oldest go first)
MAX_WRITTEN_HASHES = 1 << 20  # per group: the hashes written, remembered


def stop_lengths(num_prompt_tokens: int, junction: int, align: int,
                 tail_tokens: int = TAIL_TOKENS) -> list[int]:
    """The hit lengths worth making loadable for a prompt: every multiple of
    `align` in its last `tail_tokens` tokens, and the junction.

    >>> stop_lengths(40, 16, 8, tail_tokens=16)
    [16, 24, 32, 40]
    """
    top = num_prompt_tokens // align * align
    low = max(align, -(-(num_prompt_tokens - tail_tokens) // align) * align)
    stops = set(range(low, top + 1, align))
    if 0 < junction <= top:
        stops.add(junction // align * align)
    return sorted(stops)


def needed_blocks(manager: SingleTypeManager, num_prompt_tokens: int,
                  stops: Sequence[int]) -> list[int]:
    """The group's block indices that hits at `stops` need (all full blocks of
    the prompt for full attention), ascending.

    Sliding window W, block size 4, W - 1 = 7 (2 blocks), stops [16, 24]:
    [2, 3, 4, 5].
    """
    spec, b = manager.spec, manager.block_size
    if manager.downward_closed:
        return list(range(num_prompt_tokens // b))
    out: set[int] = set()
    for stop in stops:
        n = stop // b
        out.update(range(_first_needed(spec, n), n))
        if isinstance(spec, SlidingWindowSpec):
            out.update(range(min(n, spec.num_sink_blocks)))
    return sorted(out)


def _first_needed(spec: Any, n: int) -> int:
    """The first block a hit of `n` blocks needs in a group of this spec."""
    if isinstance(spec, SlidingWindowSpec):
        return max(0, n - spec.num_window_blocks)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        per_chunk = spec.attention_chunk_size // spec.block_size
        return n // per_chunk * per_chunk
    if isinstance(spec, MambaSpec):
        return max(0, n - 1)
    return 0


class SharedWrites:
    """The compute-time writes of one tier (see the module docstring).

    `submit(group_id, hashes, block_ids) -> bool` copies the blocks out and
    queues them (False: the writer dropped them).
    """

    def __init__(self, managers: Sequence[SingleTypeManager], cached: Sequence[Any],
                 block_bytes: Sequence[int], align: int,
                 submit: Callable[[int, list[bytes], list[int]], bool], *,
                 step_bytes: int = DEFAULT_STEP_BYTES, max_watched: int = MAX_WATCHED) -> None:
        self.managers = managers
        self.cached = cached  # per group: the pool's hash -> block map
        self.block_bytes = list(block_bytes)
        self.align = align
        self.submit = submit
        self.step_bytes = step_bytes
        self.max_watched = max_watched
        self.groups = [g for g, m in enumerate(managers) if m.accepts_lookup]
        self.written = [new_tail_set(MAX_WRITTEN_HASHES) for _ in managers]
        # request id -> (request, per group: the hashes still to write)
        self._watched: OrderedDict[str, tuple[Request, list[list[bytes]]]] = OrderedDict()
        self.queued_blocks = 0  # blocks handed to the writer
        self.skipped_blocks = 0  # wanted blocks written before (by this instance)
        self.dropped_blocks = 0  # wanted blocks given up: watch overflow, writer full

    # ---- what to write -------------------------------------------------------------

    def watch(self, request: Request, hashes: Sequence[bytes], junction: int) -> None:
        """Await the blocks hits at this request's stops need (replaces an
        earlier watch of the same request)."""
        prompt = request.num_prompt_tokens
        stops = stop_lengths(prompt, junction, self.align)
        wanted: list[list[bytes]] = [[] for _ in self.managers]
        num_wanted = 0
        for g in self.groups:
            m = self.managers[g]
            needed = needed_blocks(m, prompt, stops)
            if not needed:
                continue
            group_hashes = m.group_hashes(hashes, needed[-1] + 1)
            written = self.written[g]
            todo = [group_hashes[i] for i in needed if group_hashes[i] not in written]
            self.skipped_blocks += len(needed) - len(todo)
            wanted[g] = todo
            num_wanted += len(todo)
        self._watched.pop(request.request_id, None)
        if num_wanted:
            self._watched[request.request_id] = (request, wanted)
            while len(self._watched) > self.max_watched:
                _, (_, left) = self._watched.popitem(last=False)
                self.dropped_blocks += sum(map(len, left))

    def is_written(self, group_id: int, block_hash: bytes) -> bool:
        """Whether this instance wrote (or queued) the group's block of this hash."""
        return block_hash in self.written[group_id]

    def note_written(self, group_id: int, hashes: Sequence[bytes]) -> None:
        self.written[group_id].update(hashes)

    @property
    def num_watched(self) -> int:
        return len(self._watched)

    # ---- writing ---------------------------------------------------------------------

    def after_step(self) -> None:
        """Queue the awaited blocks the pool now holds computed, up to `step_bytes`;
        forget a request once its prompt was computed before this step and
        nothing it awaits is left in the pool."""
        budget = self.step_bytes
        for request_id in list(self._watched):
            request, wanted = self._watched[request_id]
            done = request.num_computed_tokens >= request.num_prompt_tokens
            budget = self._write_ready(wanted, budget, done)
            if not any(wanted):
                del self._watched[request_id]
            if budget <= 0:
                break

    def _write_ready(self, wanted: list[list[bytes]], budget: int, done: bool) -> int:
        """Queue the wanted blocks the pool holds (within `budget` bytes) and drop
        them from `wanted` (with the ones the pool lost when the prompt is
        `done`); the budget left."""
        for g in self.groups:
            todo = wanted[g]
            if not todo:
                continue
            cached, size, written = self.cached[g], self.block_bytes[g], self.written[g]
            hashes: list[bytes] = []
            ids: list[int] = []
            rest: list[bytes] = []
            for block_hash in todo:
                block = cached.get(block_hash)
                if block_hash in written:
                    self.skipped_blocks += 1
                elif block is None:
                    if not done:  # (done: the pool kept no such block, e.g. a Mamba
                        rest.append(block_hash)  # state its retention skipped)
                elif budget < size:
                    rest.append(block_hash)
                else:
                    hashes.append(block_hash)
                    ids.append(block.block_id)
                    budget -= size
            wanted[g] = rest
            if hashes:
                self._submit(g, hashes, ids)
        return budget

    def _submit(self, group_id: int, hashes: list[bytes], ids: list[int]) -> None:
        if self.submit(group_id, hashes, ids):
            self.written[group_id].update(hashes)
            self.queued_blocks += len(hashes)
        else:
            self.dropped_blocks += len(hashes)
