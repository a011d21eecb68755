"""The router's state and decisions, without HTTP: backends, their cache
indexes and loads, and `route` (used by `hybridkv route` and by the cluster
simulation alike)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from hybridkv.kv_cache.events import BlockEvent
from hybridkv.kv_cache.hashing import compute_block_hashes
from hybridkv.serving.router.index import PrefixIndex, Reuse
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.policy import (
    DEFAULT_BALANCE,
    DEFAULT_POLICY,
    Load,
    check_balance,
    check_policy,
    choose,
)


class NoBackendError(RuntimeError):
    """No healthy backend can take the request."""


@dataclass
class Backend:
    instance_id: str
    index: PrefixIndex
    model: str | None
    healthy: bool = True

    @property
    def bit(self) -> int:
        return self.index.bit_of[self.instance_id]


@dataclass
class Decision:
    """Where a request goes and what the router expects it to reuse there."""

    instance_id: str
    num_tokens: int
    cached_tokens: int  # reusable tokens (hybrid-prefix) or chain tokens (prefix) there
    pending_tokens: int  # added to the backend's load until the first token
    first_token_seen: bool = False
    done: bool = False


class _Group:
    """Eligible backends of one index: their slots, loads and positions."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index
        self.backends: list[Backend] = []
        self.slots: list[int] = []
        self.loads: list[Load] = []
        self.position: dict[int, int] = {}  # slot -> position in the lists

    def add(self, backend: Backend, load: Load) -> None:
        self.position[backend.bit] = len(self.slots)
        self.backends.append(backend)
        self.slots.append(backend.bit)
        self.loads.append(load)

    def credit(self, reuse: Reuse) -> list[tuple[int, int]]:
        """(position, tokens) of the eligible slots that reuse anything."""
        out = []
        position = self.position
        for tokens, mask in reuse.levels:
            while mask:
                low = mask & -mask
                mask ^= low
                i = position.get(low.bit_length() - 1)
                if i is not None:
                    out.append((i, tokens))
        return out


class Router:
    """Backends grouped by cache layout, each with a prefix index and a load.

    `route` picks a backend for a prompt's token ids; the caller then reports
    `first_token` and `finished` for the decision so loads stay current.
    """

    def __init__(self, policy: str = DEFAULT_POLICY, balance: float = DEFAULT_BALANCE) -> None:
        self.policy = check_policy(policy)
        self.balance = check_balance(balance)
        self.backends: dict[str, Backend] = {}
        self.indexes: dict[tuple, PrefixIndex] = {}
        self.loads: dict[str, Load] = {}
        self._turn = 0
        self._eligible: dict[str | None, list[_Group]] = {}

    # ---- backends --------------------------------------------------------------

    def add_backend(self, instance_id: str, layout: CacheLayout, model: str | None = None) -> None:
        """Register a backend. Again with the same layout: kept as it is (its cache
        view too); with another layout: its cache view starts empty."""
        old = self.backends.get(instance_id)
        if old is not None and old.index.layout.key == layout.key:
            old.model = model
            self._eligible.clear()
            return
        if old is not None:
            self.remove_backend(instance_id)
        index = self.indexes.get(layout.key)
        if index is None:
            index = self.indexes[layout.key] = PrefixIndex(layout)
        index.add_instance(instance_id)
        self.backends[instance_id] = Backend(instance_id, index, model)
        self.loads.setdefault(instance_id, Load())
        self._eligible.clear()

    def remove_backend(self, instance_id: str) -> None:
        backend = self.backends.pop(instance_id)
        backend.index.remove_instance(instance_id)
        self._eligible.clear()

    def set_healthy(self, instance_id: str, healthy: bool) -> None:
        backend = self.backends[instance_id]
        if backend.healthy != healthy:
            backend.healthy = healthy
            self._eligible.clear()

    def apply_events(self, instance_id: str, events: Iterable[BlockEvent]) -> None:
        self.backends[instance_id].index.apply_events(instance_id, events)

    def clear_cache_view(self, instance_id: str) -> None:
        self.backends[instance_id].index.clear(instance_id)

    # ---- decisions -------------------------------------------------------------

    def route(self, token_ids: Sequence[int], *, cache_salt: str | bytes | None = None,
              lora_name: str | None = None, model: str | None = None,
              exclude: Collection[str] = ()) -> Decision:
        """Pick a healthy backend serving `model` (any, if None) not in `exclude`.

        Raises NoBackendError when there is none, ValueError for empty
        `token_ids`.
        """
        backend, credit = self._best(token_ids, cache_salt, lora_name, model, exclude)
        self._turn += 1
        return self._commit(backend, len(token_ids), credit)

    def explain(self, token_ids: Sequence[int], *, cache_salt: str | bytes | None = None,
                lora_name: str | None = None, model: str | None = None) -> dict:
        """What `route` would decide for these tokens, changing nothing: the
        backend it would pick (None if none is eligible) and, per backend, the
        tokens it could reuse, its cached full-attention chain, health and load."""
        try:
            choice: str | None = self._best(token_ids, cache_salt, lora_name, model, ())[0] \
                .instance_id
        except NoBackendError:
            choice = None
        per_backend = {}
        for instance_id, backend in self.backends.items():
            index = backend.index
            hashes = compute_block_hashes(token_ids, index.hash_block_size,
                                          hash_algo=index.layout.hash_algo,
                                          cache_salt=cache_salt, lora_name=lora_name)
            load = self.loads[instance_id]
            per_backend[instance_id] = {
                "reusable_tokens": index.lookup(hashes, len(token_ids) - 1).tokens(backend.bit),
                "chain_tokens": index.chain_lookup(hashes, len(token_ids) - 1).tokens(
                    backend.bit),
                "cached_blocks": index.num_cached_blocks(instance_id),
                "healthy": backend.healthy, "in_flight": load.in_flight,
                "pending_tokens": load.pending_tokens, "waiting": load.waiting,
                "running": load.running}
        return {"policy": self.policy, "backend": choice, "backends": per_backend}

    def _best(self, token_ids: Sequence[int], cache_salt: str | bytes | None,
              lora_name: str | None, model: str | None,
              exclude: Collection[str]) -> tuple[Backend, int]:
        if not token_ids:
            raise ValueError("route: token_ids must not be empty")
        best: tuple[float, Backend, int] | None = None
        for group in self._candidates(model, exclude):
            cost, backend, credit = self._pick(group, token_ids, cache_salt, lora_name)
            if best is None or cost < best[0]:
                best = (cost, backend, credit)
        if best is None:
            raise NoBackendError(f"no healthy backend for model {model!r}")
        return best[1], best[2]

    def _candidates(self, model: str | None, exclude: Collection[str]) -> list[_Group]:
        """Eligible backends per index (cached while backends and health stay)."""
        if not exclude and model in self._eligible:
            return self._eligible[model]
        groups: dict[int, _Group] = {}
        for backend in self.backends.values():
            if not backend.healthy or backend.instance_id in exclude:
                continue
            if model is not None and backend.model is not None and backend.model != model:
                continue
            group = groups.setdefault(id(backend.index), _Group(backend.index))
            group.add(backend, self.loads[backend.instance_id])
        out = list(groups.values())
        if not exclude:
            self._eligible[model] = out
        return out

    def _pick(self, group: _Group, token_ids: Sequence[int], cache_salt: str | bytes | None,
              lora_name: str | None) -> tuple[float, Backend, int]:
        """The best backend of one index: (cost, backend, reusable or chain tokens)."""
        index = group.index
        credit: list[tuple[int, int]] = []
        if self.policy in ("hybrid-prefix", "prefix", "prefix-balanced"):
            hashes = compute_block_hashes(token_ids, index.hash_block_size,
                                          hash_algo=index.layout.hash_algo,
                                          cache_salt=cache_salt, lora_name=lora_name)
            if self.policy == "hybrid-prefix":
                reuse = index.lookup(hashes, len(token_ids) - 1)
            else:
                reuse = index.chain_lookup(hashes, len(token_ids) - 1)
            credit = group.credit(reuse)
        i = choose(self.policy, group.slots, group.loads, credit, self.balance, self._turn)
        tokens = next((t for j, t in credit if j == i), 0)
        cost = self._cost(len(token_ids), tokens, group.loads[i])
        return cost, group.backends[i], tokens

    def _cost(self, num_tokens: int, tokens: int, load: Load) -> float:
        """Comparable across indexes (several layouts serve one model)."""
        if self.policy in ("hybrid-prefix", "prefix-balanced"):
            return num_tokens - tokens + self.balance * load.pending_tokens
        if self.policy == "prefix":
            return -tokens
        if self.policy == "least-loaded":
            return load.num_requests
        return 0.0

    def _commit(self, backend: Backend, num_tokens: int, cached: int) -> Decision:
        pending = num_tokens - cached
        load = self.loads[backend.instance_id]
        load.in_flight += 1
        load.pending_tokens += pending
        return Decision(backend.instance_id, num_tokens, cached, pending)

    def first_token(self, decision: Decision) -> None:
        """The request's prompt is computed: its tokens leave the pending load."""
        if not decision.first_token_seen:
            decision.first_token_seen = True
            self.loads[decision.instance_id].pending_tokens -= decision.pending_tokens

    def finished(self, decision: Decision) -> None:
        """The request ended (or failed) on its backend."""
        if not decision.done:
            self.first_token(decision)
            decision.done = True
            self.loads[decision.instance_id].in_flight -= 1
