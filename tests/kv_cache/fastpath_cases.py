"""Edge cases at the entry points the C fast path implements, as a list of observations.

`observe()` runs every case and records what happened (the result, or the
exception's type and, except for argument-binding TypeErrors, its message).
test_fastpath.py compares the list from this process (the C extension) with
the one from a process run with HYBRIDKV_DISABLE_FASTPATH=1 (the pure-Python
reference): they must be equal.

    python tests/kv_cache/fastpath_cases.py   # prints the observations as JSON
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable

import numpy as np

from hybridkv import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from hybridkv.kv_cache.managers import FullAttentionManager, register_manager


def _outcome(fn: Callable[[], object]) -> object:
    try:
        return ["ok", _plain(fn())]
    except TypeError:  # argument binding: the message names the function
        return ["TypeError"]
    except (ValueError, KeyError, AssertionError) as error:
        return [type(error).__name__, str(error)]


def _plain(value: object) -> object:
    """JSON-able form of results: block ids for blocks, fields for requests."""
    if hasattr(value, "get_block_ids"):
        return value.get_block_ids()  # type: ignore[attr-defined]
    if isinstance(value, Request):
        return [value.request_id, list(value.all_token_ids), value.num_prompt_tokens,
                repr(value.num_computed_tokens), value.cache_salt, value.lora_name,
                list(value.mm_hashes), value.max_tokens, value.hasher is None]
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, int | str | list):
        return value
    return repr(value)


class IdStr(str):
    pass


class MyRequest(Request):
    __slots__ = ()


def request_cases() -> list:
    inputs: list[tuple[tuple, dict]] = [
        (("a", [1, 2]), {}), (("a", (1, 2)), {}), (("", [1]), {}), (("a", []), {}),
        (("a", [True]), {}), (("a", [2**32]), {}), (("a", [2**32 - 1]), {}), (("a", [-1]), {}),
        (("a", "ab"), {}), ((3, [1]), {}), (("a", [1]), {"cache_salt": 5}),
        (("a", [1]), {"cache_salt": "s", "lora_name": "x", "max_tokens": 3}),
        (("a", range(5)), {}), (("a", [np.int64(7), 8]), {}), (("a", [1.0]), {}),
        ((IdStr("b"), [1, 2]), {}), (("a", [1, 2, 3]), {"vocab_size": 3}),
        (("a", [1, 2]), {"mm_hashes": [("h", 0, 1)]}), (("a",), {}), ((), {}),
        (("a", [1]), {"unknown": 1}), (("a", [2**40]), {}), (("a", [0] * 40 + [None]), {}),
    ]
    out = [_outcome(lambda a=a, k=k: Request(*a, **k)) for a, k in inputs]
    out.append(_outcome(lambda: MyRequest("m", [1, 2])))
    for tokens in (5, [5], [5, 6], (5,), [], [-1], [True], True, 2**32, [2**32], "a",
                   np.int32(9), [np.int32(9)], [5.0], None):
        req = Request("r", [1, 2, 3])
        result = _outcome(lambda req=req, t=tokens: req.append_output_token_ids(t))
        out.append([result, list(req.all_token_ids)])
    return out


def _manager(groups: list, **kwargs) -> KVCacheManager:
    specs = [KVCacheGroupSpec([f"l{i}"], spec) for i, spec in enumerate(groups)]
    return KVCacheManager(KVCacheConfig(40, specs), **kwargs)


def allocate_cases() -> list:
    out: list = []
    for groups in ([FullAttentionSpec(4)],
                   [FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=6)],
                   [FullAttentionSpec(4), MambaSpec(4)]):
        kv = _manager(groups)
        out += argument_cases(kv, Request("a", list(range(20))))
        out.append(hit_cases(kv))
    return out


def argument_cases(kv: KVCacheManager, req: Request) -> list:
    """allocate_slots and free with arguments of every shape, good and bad."""
    calls: list[Callable[[], object]] = [
        lambda: kv.allocate_slots(req, True), lambda: kv.allocate_slots(req, 2.0),
        lambda: kv.allocate_slots(req, -1), lambda: kv.allocate_slots(req, 21),
        lambda: kv.allocate_slots("a", 1), lambda: kv.allocate_slots(req, 1, False),
        lambda: kv.allocate_slots(req, 1, None), lambda: kv.allocate_slots(req, 1, 4),
        lambda: kv.allocate_slots(req, 1, 0, None, 5), lambda: kv.allocate_slots(req),
        lambda: kv.allocate_slots(req, 1, bogus=1),
        lambda: kv.allocate_slots(request=req, num_new_tokens=np.int64(6)),
        lambda: kv.allocate_slots(req, 6, num_new_computed_tokens=0),
        lambda: kv.allocate_slots(Request("a", list(range(20))), 1),
        lambda: kv.allocate_slots(req, 0),
    ]
    out = [_outcome(call) for call in calls]
    req.num_computed_tokens = 6
    out.append(_outcome(lambda: kv.allocate_slots(req, 2)))
    req.num_computed_tokens = np.int64(8)
    out.append(_outcome(lambda: kv.allocate_slots(req, 5)))
    req.num_computed_tokens = 13
    req.all_token_ids = tuple(req.all_token_ids)  # type: ignore[assignment]
    out.append(_outcome(lambda: kv.allocate_slots(req, 3)))
    req.all_token_ids = list(req.all_token_ids)
    req.num_computed_tokens = 16
    out += [_outcome(lambda: kv.free(Request("a", [1]))), _outcome(lambda: kv.free(req)),
            _outcome(lambda: kv.free(req)), _outcome(lambda: kv.free("a"))]  # type: ignore
    return out


def hit_cases(kv: KVCacheManager) -> list:
    """Admissions adopting a hit: good ones and every way a hit can be wrong."""
    out: list = []
    for i in range(3):
        out += admission_cases(kv, Request(f"h{i}", list(range(17)) + [99, i]), i == 0)
    out.append(_outcome(lambda: kv.get_computed_blocks("h0")))  # type: ignore[arg-type]
    kv.check_integrity()
    return out


def admission_cases(kv: KVCacheManager, req: Request, wrong_ones: bool) -> list:
    blocks, hit = kv.get_computed_blocks(req)
    out: list = [[hit, blocks.get_block_ids()]]
    if wrong_ones:
        out.append(_outcome(lambda: kv.allocate_slots(req, 1, hit + 4, blocks)))
        out.append(_outcome(lambda: kv.allocate_slots(req, 1, hit, "blocks")))  # type: ignore
        req.num_computed_tokens = 4
        out.append(_outcome(lambda: kv.allocate_slots(req, 1, hit, blocks)))
        req.num_computed_tokens = 0
    out.append(_outcome(lambda: kv.allocate_slots(req, req.num_tokens - hit, hit, blocks)))
    out.append(_outcome(lambda: kv.allocate_slots(req, 0, hit, blocks)))
    out.append(kv.get_block_ids(req.request_id) if req.request_id in kv._held else None)
    return out


class MyFull(FullAttentionManager):
    """A registered subclass: the C paths do not know it, so Python runs."""


class MySpec(FullAttentionSpec):
    pass


def custom_manager_cases() -> list:
    register_manager(MySpec, MyFull)
    out: list = []
    for caching in (True, False):
        kv = _manager([MySpec(4), SlidingWindowSpec(4, sliding_window=5)],
                      enable_caching=caching)
        out.append(kv._core.native)
        for i in range(3):
            out += decode_cases(kv, Request(f"c{i}", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] + [i]), i)
        kv.check_integrity()
    return out


def decode_cases(kv: KVCacheManager, req: Request, token: int) -> list:
    blocks, hit = kv.get_computed_blocks(req)
    out: list = [[hit, _outcome(lambda: kv.allocate_slots(req, req.num_tokens - hit, hit,
                                                          blocks))]]
    req.num_computed_tokens = req.num_tokens
    req.append_output_token_ids(token)
    out.append(_outcome(lambda: kv.allocate_slots(req, 1)))
    out.append(kv.get_block_ids(req.request_id))
    return out


def warning_cases() -> list:
    """The repeated-miss warning names the caller of get_computed_blocks."""
    kv = _manager([FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=5)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            kv.get_computed_blocks(Request(f"w{i}", list(range(12))))
    return [[w.category.__name__, os.path.basename(w.filename)] for w in caught]


def observe() -> list:
    return [request_cases(), allocate_cases(), custom_manager_cases(), warning_cases()]


if __name__ == "__main__":
    json.dump(observe(), sys.stdout, default=repr)
