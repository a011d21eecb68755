"""Per-call cost of the KV cache manager's decode-step calls, per backend.

A decode step of a request the manager holds mostly changes nothing (the
next token fits in its last block): `allocate_slots(request, 1)` returns the
shared empty result at once. This times that call and `append_output_token_ids`
in a loop (`--number` calls, `--repeats` times; median and spread in ns per
call), `Request(...)` of a 1,280-token prompt, and a `get_computed_blocks` +
`allocate_slots` + `free` round for a 1,024-token prompt that hits (µs per
round), on the full and swa configs of the replay
(`hybridkv.tools.replay.make_config`).

    python benchmarks/bench_manager_calls.py [--backends c,python] [--out DIR]

`--backends` names the manager backends to time (`KVCacheManager(backend=...)`);
a tree without that argument runs its default backend once (label `default`).
`Request` takes the C type as its base whenever the extension is loaded: to
time its Python reference, run with HYBRIDKV_DISABLE_FASTPATH=1 `--backends python`.
Writes DIR/manager_calls.json.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
import timeit

from common import add_common_args, prepare_out, write_result

from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.kv_cache.request import Request
from hybridkv.tools.replay import make_config


def make_manager(config: str, backend: str) -> KVCacheManager:
    params = inspect.signature(KVCacheManager).parameters
    kwargs = {"backend": backend} if "backend" in params and backend != "default" else {}
    return KVCacheManager(make_config(config, 4096), **kwargs)  # type: ignore[arg-type]


def held_decoding_request(kv: KVCacheManager) -> Request:
    """A request holding blocks, one token past its prompt, inside its last block."""
    req = Request("decode", list(range(20)))
    assert kv.allocate_slots(req, 20) is not None
    req.num_computed_tokens = 20
    req.append_output_token_ids(7)
    return req


def time_loop(stmt: str, names: dict, number: int, repeats: int) -> list[float]:
    """ns per run of `stmt` (timeit's loop, no extra call) over `number` runs, `repeats` times."""
    timer = timeit.Timer(stmt, globals=names)
    return [t / number * 1e9 for t in timer.repeat(repeat=repeats, number=number)]


def decode_call(kv: KVCacheManager, number: int, repeats: int) -> list[float]:
    req = held_decoding_request(kv)
    allocate = kv.allocate_slots
    first = allocate(req, 1)
    assert first is not None and not any(first.blocks), "the timed call must change nothing"
    return time_loop("allocate(req, 1)", {"allocate": allocate, "req": req}, number, repeats)


def request_call(number: int, repeats: int) -> list[float]:
    """ns per `Request(id, prompt)` of a 1,280-token prompt (the replay's)."""
    names = {"Request": Request, "prompt": list(range(1280))}
    return time_loop("Request('r', prompt)", names, number, repeats)


def append_call(number: int, repeats: int) -> list[float]:
    req = Request("append", [1])
    return time_loop("append(5)", {"append": req.append_output_token_ids}, number, repeats)


def hit_round(kv: KVCacheManager, repeats: int) -> list[float]:
    """µs per lookup + allocate + free of a 1,024-token prompt whose prefix is cached."""
    prompt = list(range(1024))
    warm = Request("warm", prompt)
    assert kv.allocate_slots(warm, 1024) is not None
    warm.num_computed_tokens = 1024
    kv.free(warm)
    out = []
    for _ in range(repeats):
        start, rounds = time.perf_counter(), 2000
        for i in range(rounds):
            req = Request(f"r{i}", prompt)
            blocks, hit = kv.get_computed_blocks(req)
            assert kv.allocate_slots(req, 1024 - hit, hit, blocks) is not None
            kv.free(req)
        out.append((time.perf_counter() - start) / rounds * 1e6)
    return out


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "all": [round(v, 3) for v in values]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="c,python")
    ap.add_argument("--number", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    add_common_args(ap)
    args = ap.parse_args()
    out_dir = prepare_out(args.out)
    number = 2000 if args.quick else args.number
    result: dict = {}
    if "backend" not in inspect.signature(KVCacheManager).parameters:
        args.backends = "default"
    for backend in args.backends.split(","):
        row = {"append_ns": summary(append_call(number, args.repeats)),
               "request_ns": summary(request_call(number // 10, args.repeats))}
        for config in ("full", "swa"):
            row[f"{config}_decode_ns"] = summary(decode_call(make_manager(config, backend),
                                                             number, args.repeats))
            row[f"{config}_hit_round_us"] = summary(hit_round(make_manager(config, backend),
                                                              3 if args.quick else 5))
        result[backend] = row
        print(backend, {k: round(v["median"], 2) for k, v in row.items()}, flush=True)
    print(write_result("manager_calls", result, out_dir))


if __name__ == "__main__":
    main()
