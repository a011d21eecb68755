"""One timed replay of a trace file through hybridkv's or vLLM's KV cache manager.

Run by `bench_vs_vllm.py`, once per side, config and round, each in a fresh
process: `--side hybridkv` under the Python that runs the comparison,
`--side vllm` under the one that has vLLM (both with this checkout on
PYTHONPATH, so both use the same trace reader and replay driver,
`hybridkv.tools.replay`). The worker loads the trace, refuses it if its
fingerprint is not `--fingerprint`, replays the first `--warmup` requests on
a manager of its own (untimed: first-call costs), then the whole trace on a
fresh manager, and prints one line `RESULT {json}`: requests/s and per-call
times, the hit rate and each request's cached tokens at admission, and the
blocks still held after every request was freed.

    python benchmarks/vs_vllm_worker.py --side hybridkv --config swa --trace T --fingerprint F
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import warnings

from common import add_replay_args

from hybridkv.kv_cache.kv_cache_manager import KVCacheManager
from hybridkv.tools.replay import CONFIG_GROUPS, ManagerAdapter, make_config, replay
from hybridkv.tools.trace_file import load_trace

SIDES = ("hybridkv", "vllm")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", choices=SIDES, required=True)
    ap.add_argument("--config", choices=tuple(CONFIG_GROUPS), required=True)
    ap.add_argument("--trace", required=True, metavar="FILE")
    ap.add_argument("--fingerprint", required=True)
    add_replay_args(ap)
    ap.add_argument("--warmup", type=int, default=64, metavar="N")
    return ap.parse_args(argv)


def hybridkv_adapter(args: argparse.Namespace):
    """hybridkv's manager, exactly as `bench_replay.py` builds it."""
    config = make_config(args.config, args.num_blocks, window=args.window,
                         block_size=args.block_size)
    return ManagerAdapter(KVCacheManager(config, hash_algo=args.hash_algo))


def vllm_adapter(args: argparse.Namespace):
    from vllm_adapter import VllmAdapter, make_vllm_config

    config = make_vllm_config(args.config, args.num_blocks, args.window, args.block_size)
    return VllmAdapter(config, max_batched_tokens=args.max_batched_tokens,
                       max_model_len=args.max_model_len, hash_algo=args.hash_algo)


def side_info(side: str) -> dict:
    """Versions of what runs on this side."""
    info = {"python": sys.version.split()[0], "executable": sys.executable,
            "platform": platform.platform()}
    if side == "vllm":
        import torch
        import vllm

        info.update(vllm=vllm.__version__, torch=torch.__version__)
    else:
        from hybridkv import __version__
        from hybridkv.kv_cache.hashing import hashing_backend

        info.update(hybridkv=__version__, hashing=hashing_backend().describe())
    return info


def run(args: argparse.Namespace) -> dict:
    trace = load_trace(args.trace)
    fingerprint = trace.fingerprint()
    if fingerprint != args.fingerprint:
        raise SystemExit(f"{args.trace}: fingerprint {fingerprint}, expected "
                         f"{args.fingerprint}")
    make = vllm_adapter if args.side == "vllm" else hybridkv_adapter
    drive = dict(max_running=args.max_running, max_batched_tokens=args.max_batched_tokens,
                 timed=True)
    if args.warmup > 0:
        replay(trace.requests[:args.warmup], make(args), **drive)
    adapter = make(args)
    gc.collect()
    res = replay(trace.requests, adapter, **drive)
    if hasattr(adapter, "drain"):
        adapter.drain()
    usable = args.num_blocks - 1  # block 0 is the null block on both sides
    return {"side": args.side, "config": args.config, "fingerprint": fingerprint,
            "info": side_info(args.side), **res.as_dict(),
            "hit_tokens": res.hit_tokens, "prompt_tokens": res.prompt_tokens,
            "request_hits": [res.request_hits.get(r.request_id, -1) for r in trace.requests],
            "leaked_blocks": usable - adapter.num_free_blocks}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)  # hybridkv's repeated-miss notice
    print("RESULT " + json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
