"""The router's state and decisions, without HTTP: backends, their cache
indexes and loads, and `route` (used by `hybridkv route` and by the cluster
simulation alike).

With a shared KV store (`hybridkv route --kv-store`), `route` also takes
what the store holds for a prompt (`stored`, see `store_view`): under
`hybrid-prefix` a backend bound to that store is credited, on top of the
tokens its own pool can reuse, STORE_WEIGHT per further token it could
reuse with the store's blocks (loaded rather than computed).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hybridkv.kv_cache.events import BlockEvent
from hybridkv.kv_cache.hashing import compute_block_hashes
from hybridkv.serving.router.index import PrefixIndex, Reuse
from hybridkv.serving.router.layout import CacheLayout
from hybridkv.serving.router.policy import (
    DEFAULT_BALANCE,
    DEFAULT_POLICY,
    Load,
    LoadCosts,
    check_balance,
    check_policy,
    choose,
)

# a token loadable from the shared store counts as this fraction of one the
# backend's own pool holds: loading 2,048 tokens took 1/44 of recomputing them
# (benchmarks/RESULTS.md, KV tiers), but a loaded copy takes pool blocks as a
# computed one does (the reason `balance` is below 1), so it stays well below 1
STORE_WEIGHT = 0.8


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


@dataclass(slots=True)
class Decision:
    """Where a request goes and what the router expects it to reuse there."""

    instance_id: str
    num_tokens: int
    cached_tokens: int  # reusable tokens (hybrid-prefix) or chain tokens (prefix) there
    pending_tokens: int  # added to the backend's load until the first token
    store_tokens: int = 0  # of cached_tokens, the ones loadable only from the shared store
    first_token_seen: bool = False
    done: bool = False


class PromptHashes:
    """A prompt's block hashes for each index's hashing (block size, algorithm),
    computed once each: `get(index)`."""

    __slots__ = ("token_ids", "cache_salt", "lora_name", "_memo")

    def __init__(self, token_ids: Sequence[int], cache_salt: str | bytes | None = None,
                 lora_name: str | None = None) -> None:
        self.token_ids = token_ids
        self.cache_salt = cache_salt
        self.lora_name = lora_name
        self._memo: dict[tuple[int, str], list[bytes]] = {}

    def get(self, index: PrefixIndex) -> list[bytes]:
        key = (index.hash_block_size, index.layout.hash_algo)
        hashes = self._memo.get(key)
        if hashes is None:
            hashes = self._memo[key] = compute_block_hashes(
                self.token_ids, key[0], hash_algo=key[1], cache_salt=self.cache_salt,
                lora_name=self.lora_name)
        return hashes


class _Group:
    """Eligible backends of one index: their slots, load costs and positions."""

    def __init__(self, index: PrefixIndex, policy: str, balance: float) -> None:
        self.index = index
        self.backends: list[Backend] = []
        self.loads = LoadCosts(policy, balance)  # kept current by the Router
        self.position: dict[int, int] = {}  # slot -> position in the lists

    def add(self, backend: Backend, load: Load) -> int:
        self.position[backend.bit] = len(self.backends)
        self.backends.append(backend)
        return self.loads.add(load)

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

    def store_credit(self, own: list[tuple[int, int]],
                     combined: Reuse) -> tuple[list[tuple[int, float]], dict[int, int]]:
        """Credit with a shared store: (position, own + STORE_WEIGHT x the further
        tokens `combined` (pool or store) reaches), and per position those
        further tokens."""
        tokens = dict(own)
        further = {}
        for i, reach in self.credit(combined):
            more = reach - tokens.get(i, 0)
            if more > 0:
                further[i] = more
        out = [(i, t + STORE_WEIGHT * further.get(i, 0)) for i, t in own]
        out += [(i, STORE_WEIGHT * more) for i, more in further.items() if i not in tokens]
        return out, further


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
        # where each backend's load cost sits in the cached eligible groups
        self._cost_slots: dict[str, list[tuple[LoadCosts, int]]] = {}

    # ---- backends --------------------------------------------------------------

    def add_backend(self, instance_id: str, layout: CacheLayout, model: str | None = None) -> None:
        """Register a backend. Again with the same layout: kept as it is (its cache
        view too); with another layout: its cache view starts empty."""
        old = self.backends.get(instance_id)
        if old is not None and old.index.layout.key == layout.key:
            old.model = model
            self._forget_eligible()
            return
        if old is not None:
            self.remove_backend(instance_id)
        index = self.indexes.get(layout.key)
        if index is None:
            index = self.indexes[layout.key] = PrefixIndex(layout)
        index.add_instance(instance_id)
        self.backends[instance_id] = Backend(instance_id, index, model)
        self.loads.setdefault(instance_id, Load())
        self._forget_eligible()

    def remove_backend(self, instance_id: str) -> None:
        backend = self.backends.pop(instance_id)
        backend.index.remove_instance(instance_id)
        self._forget_eligible()

    def set_healthy(self, instance_id: str, healthy: bool) -> None:
        backend = self.backends[instance_id]
        if backend.healthy != healthy:
            backend.healthy = healthy
            self._forget_eligible()

    def update_load(self, instance_id: str, **fields: int) -> None:
        """Set fields of a backend's `Load` (e.g. `waiting`, `running` polled from
        its metrics); the policy sees them from the next decision on."""
        load = self.loads[instance_id]
        before = load.num_requests
        for name, value in fields.items():
            setattr(load, name, value)
        self._load_changed(instance_id, before)

    def _forget_eligible(self) -> None:
        self._eligible.clear()
        self._cost_slots.clear()

    def _load_changed(self, instance_id: str, requests_before: int) -> None:
        for costs, position in self._cost_slots.get(instance_id, ()):
            costs.changed(position, requests_before)

    def apply_events(self, instance_id: str, events: Iterable[BlockEvent]) -> None:
        self.backends[instance_id].index.apply_events(instance_id, events)

    def clear_cache_view(self, instance_id: str) -> None:
        self.backends[instance_id].index.clear(instance_id)

    # ---- decisions -------------------------------------------------------------

    def route(self, token_ids: Sequence[int], *, cache_salt: str | bytes | None = None,
              lora_name: str | None = None, model: str | None = None,
              exclude: Collection[str] = (), hashes: PromptHashes | None = None,
              stored: Mapping[PrefixIndex, Mapping[bytes, int]] | None = None) -> Decision:
        """Pick a healthy backend serving `model` (any, if None) not in `exclude`.

        `hashes`: the prompt's hashes if already computed (same tokens, salt
        and LoRA). `stored`: per index, hash -> packed bits of the blocks a
        shared store holds for the backends bound to it (`StoreView.stored`).
        Raises NoBackendError when there is none, ValueError for empty
        `token_ids`.
        """
        if not token_ids:
            raise ValueError("route: token_ids must not be empty")
        prompt = hashes or PromptHashes(token_ids, cache_salt, lora_name)
        best: tuple[float, Backend, int, int] | None = None
        for group in self._candidates(model, exclude):
            pick = self._pick(group, prompt, stored)
            if best is None or pick[0] < best[0]:
                best = pick
        if best is None:
            raise NoBackendError(f"no healthy backend for model {model!r}")
        self._turn += 1
        return self._commit(best[1], len(token_ids), best[2], best[3])

    def explain(self, token_ids: Sequence[int], *, cache_salt: str | bytes | None = None,
                lora_name: str | None = None, model: str | None = None,
                stored: Mapping[PrefixIndex, Mapping[bytes, int]] | None = None) -> dict:
        """What `route` would decide for these tokens, changing nothing: the
        backend it would pick (None if none is eligible) and, per backend, the
        tokens its pool could reuse, the further ones the shared store adds,
        its cached full-attention chain, health and load."""
        if not token_ids:
            raise ValueError("explain: token_ids must not be empty")
        prompt = PromptHashes(token_ids, cache_salt, lora_name)
        choice: str | None = None
        best: float | None = None
        for group in self._candidates(model, ()):
            pick = self._pick(group, prompt, stored)
            if best is None or pick[0] < best:
                best, choice = pick[0], pick[1].instance_id
        per_backend = {}
        for instance_id, backend in self.backends.items():
            index = backend.index
            hashes = prompt.get(index)
            n = len(token_ids) - 1
            own = index.lookup(hashes, n).tokens(backend.bit)
            extra = stored.get(index) if stored else None
            load = self.loads[instance_id]
            per_backend[instance_id] = {
                "reusable_tokens": own,
                "store_tokens": index.lookup(hashes, n, extra).tokens(backend.bit) - own
                if extra else 0,
                "chain_tokens": index.chain_lookup(hashes, n).tokens(backend.bit),
                "cached_blocks": index.num_cached_blocks(instance_id),
                "healthy": backend.healthy, "in_flight": load.in_flight,
                "pending_tokens": load.pending_tokens, "waiting": load.waiting,
                "running": load.running}
        return {"policy": self.policy, "backend": choice, "backends": per_backend}

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
            group = groups.get(id(backend.index))
            if group is None:
                group = groups[id(backend.index)] = _Group(backend.index, self.policy,
                                                           self.balance)
            position = group.add(backend, self.loads[backend.instance_id])
            if not exclude:
                self._cost_slots.setdefault(backend.instance_id, []).append(
                    (group.loads, position))
        out = list(groups.values())
        for group in out:
            group.loads.refresh()
        if not exclude:
            self._eligible[model] = out
        return out

    def _pick(self, group: _Group, prompt: PromptHashes,
              stored: Mapping[PrefixIndex, Mapping[bytes, int]] | None,
              ) -> tuple[float, Backend, int, int]:
        """The best backend of one index: (cost, backend, tokens it reuses there,
        of those the ones only the store holds).

        Costs leave out the prompt length (the same for every index), so they
        compare across indexes (several layouts serving one model)."""
        policy = self.policy
        if policy not in ("hybrid-prefix", "prefix", "prefix-balanced"):
            i, cost = choose(policy, group.loads.costs, [], self._turn)
            return cost, group.backends[i], 0, 0
        index = group.index
        hashes = prompt.get(index)
        max_tokens = len(prompt.token_ids) - 1
        if policy != "hybrid-prefix":
            credit = group.credit(index.chain_lookup(hashes, max_tokens))
        else:
            credit = group.credit(index.lookup(hashes, max_tokens))
            extra = stored.get(index) if stored else None
            if extra:
                weighted, further = group.store_credit(
                    credit, index.lookup(hashes, max_tokens, extra))
                i, cost = choose(policy, group.loads.costs, weighted, self._turn)
                own = next((t for j, t in credit if j == i), 0)
                more = further.get(i, 0)
                return cost, group.backends[i], own + more, more
        i, cost = choose(policy, group.loads.costs, credit, self._turn)
        tokens = next((t for j, t in credit if j == i), 0) if credit else 0
        return cost, group.backends[i], tokens, 0

    def _commit(self, backend: Backend, num_tokens: int, cached: int,
                from_store: int) -> Decision:
        pending = num_tokens - cached
        load = self.loads[backend.instance_id]
        before = load.num_requests
        load.in_flight += 1
        load.pending_tokens += pending
        self._load_changed(backend.instance_id, before)
        return Decision(backend.instance_id, num_tokens, cached, pending, from_store)

    def first_token(self, decision: Decision) -> None:
        """The request's prompt is computed: its tokens leave the pending load."""
        if not decision.first_token_seen:
            decision.first_token_seen = True
            if decision.pending_tokens:
                load = self.loads[decision.instance_id]
                load.pending_tokens -= decision.pending_tokens
                self._load_changed(decision.instance_id, load.num_requests)

    def finished(self, decision: Decision) -> None:
        """The request ended (or failed) on its backend."""
        if not decision.done:
            decision.done = True
            load = self.loads[decision.instance_id]
            before = load.num_requests
            if not decision.first_token_seen:
                decision.first_token_seen = True
                load.pending_tokens -= decision.pending_tokens
            load.in_flight -= 1
            self._load_changed(decision.instance_id, before)
