"""The manager's hot paths: the C extension `_fastpath`, or the pure-Python reference here.

Every call a scheduler makes per token (`Request.append_output_token_ids`,
a decode step's `KVCacheManager.allocate_slots`) and the pool and group
work behind the others run in `hybridkv._native._fastpath` when it was
built (with the package, like the hashing extension; it needs only a C
compiler and Python's headers). It keeps no state of its own: it reads and
changes the same block records, lists, dicts and policy objects as the
Python code, and calls the Python methods for per-type rules, the eviction
policy and listeners. The classes below are the reference it must match
decision for decision (`hybridkv.tools.digest` hashes every block id, hit,
stat and event over many workloads; the tests compare both paths).

Without the extension (not built, or `HYBRIDKV_DISABLE_FASTPATH=1`) these
Python bases are used; `fastpath_backend()` says which runs.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, NamedTuple

from hybridkv.kv_cache.extensions import load_extension

DISABLE_ENV = "HYBRIDKV_DISABLE_FASTPATH"


def _load() -> tuple[Any, str | None]:
    """(the C module, None) or (None, why it is not used)."""
    if os.environ.get(DISABLE_ENV) == "1":
        return None, f"disabled ({DISABLE_ENV}=1)"
    return load_extension("hybridkv._native._fastpath")


native, NATIVE_ERROR = _load()


class FastPathBackend(NamedTuple):
    """Which manager paths run: the C extension or the Python reference."""

    c_extension: bool
    reason: str | None  # why the C extension is not used, else None

    def describe(self) -> str:
        if self.c_extension:
            return "C extension"
        return f"pure Python reference, several times slower: {self.reason}"


def fastpath_backend() -> FastPathBackend:
    return FastPathBackend(native is not None, NATIVE_ERROR)


_warned = False


def warn_if_missing() -> None:
    """Warn once per process that the extension is missing (not when disabled on purpose)."""
    global _warned
    if _warned or native is not None or os.environ.get(DISABLE_ENV) == "1":
        return
    _warned = True
    warnings.warn(f"hybridkv: C fast-path extension not built ({NATIVE_ERROR}); the KV cache "
                  f"manager runs its pure-Python reference, several times slower. Reinstall "
                  f"with a C compiler and Python headers, or set {DISABLE_ENV}=1 if this is "
                  f"intended.", RuntimeWarning, stacklevel=3)


class RequestCore:
    """The fields of a request the manager reads on every call, and appending a
    decoded token (the base of `Request`, which validates and adds keys)."""

    __slots__ = ("request_id", "all_token_ids", "num_computed_tokens", "num_prompt_tokens",
                 "hasher", "__weakref__")

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int
    num_prompt_tokens: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._init_checked(*args, **kwargs)

    def _init_checked(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def append_output_token_ids(self, token_ids: Any) -> None:
        """Append generated token(s); their blocks are hashed when they fill.

        Raises ValueError (appending nothing) for ids not in [0, 2**32).
        """
        if type(token_ids) is list and len(token_ids) == 1:  # one decoded token
            token = token_ids[0]
            if type(token) is int and 0 <= token <= 0xFFFFFFFF:
                self.all_token_ids.append(token)
                return
        elif type(token_ids) is int and 0 <= token_ids <= 0xFFFFFFFF:
            self.all_token_ids.append(token_ids)
            return
        self._append_checked(token_ids)

    def _append_checked(self, token_ids: Any) -> None:
        raise NotImplementedError

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


class Held:
    """A request holding blocks, as the manager tracks it.

    `junction`: how far its prompt matched cached full-attention blocks at its
    last lookup (groups rate and keep blocks by it). Fast path: up to
    `max_tokens` tokens and `max_computed` computed tokens, an allocation
    changes nothing in any group.
    """

    __slots__ = ("request", "junction", "max_tokens", "max_computed")

    def __init__(self, request: Any, junction: int) -> None:
        self.request = request
        self.junction = junction
        self.max_tokens = 0
        self.max_computed = 0


class BlocksCore:
    """Blocks per group (the base of `KVCacheBlocks`)."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: Any) -> None:
        self.blocks = blocks


# the C paths' code for a group's manager type; KIND_OTHER (a type they do not know)
# makes the whole manager run the Python paths
KIND_OTHER, KIND_FULL, KIND_SLIDING, KIND_CHUNKED, KIND_MAMBA = range(5)


class ManagerCore:
    """The base of `KVCacheManager`: `allocate_slots`, whose common case (a request
    this manager holds, an allocation under its fast-path limits) changes
    nothing and returns at once, and the entry points the C extension
    implements (`_allocate`, `_lookup`, `_release`): here the Python methods."""

    _held: dict[str, Any]
    _no_blocks: Any
    _request_type: Any = None
    _native = False

    def _bind(self, request_type: type, blocks_type: type, pool: Any,
              groups: list[tuple[Any, int]], alignment: int, caching: bool) -> None:
        self._request_type = request_type

    # the subclass's reference methods, with no frame in between
    _allocate = property(lambda self: self._allocate_py)
    _lookup = property(lambda self: self._lookup_py)
    _release = property(lambda self: self._release_py)

    def allocate_slots(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Any = None) -> Any:
        """Reserve slots for the next `num_new_tokens` tokens after the computed ones.

        `num_new_computed_tokens`/`new_computed_blocks` adopt a hit from
        `get_computed_blocks` (for a request that holds no blocks). Returns the
        newly allocated blocks per group (not the cached full-attention blocks
        the request takes for data it is about to recompute, which
        `get_blocks` lists with the rest), or None, with no state change at all,
        when the pool can't supply them now: other requests hold blocks, wait
        for them (or preempt one).

        Raises ValueError, changing nothing, for counts past the request's
        tokens, a hit that does not match, or an allocation the pool could not
        supply even with no other request holding blocks: waiting would never
        help (`can_fit` tells beforehand whether a request fits at all).
        """
        if type(num_new_computed_tokens) is int and num_new_computed_tokens == 0 \
                and self._request_type is not None and isinstance(request, self._request_type):
            held = self._held.get(request.request_id)
            if held is not None and held.request is request and type(num_new_tokens) is int \
                    and num_new_tokens >= 0 and type(request.num_computed_tokens) is int \
                    and request.num_computed_tokens >= 0 \
                    and type(request.all_token_ids) is list:
                computed = request.num_computed_tokens
                num_tokens = computed + num_new_tokens
                if num_tokens <= len(request.all_token_ids):
                    if num_tokens <= held.max_tokens and computed <= held.max_computed:
                        return self._no_blocks  # an allocation that changes nothing
                    return self._allocate(held, computed, num_tokens, None,
                                          computed > held.max_computed)
        return self._allocate_checked(request, num_new_tokens, num_new_computed_tokens,
                                      new_computed_blocks)

    def _allocate_checked(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int,
                          new_computed_blocks: Any) -> Any:
        raise NotImplementedError
