"""vLLM's `prefix_repetition` stream replayed offline on a Gemma-3-270M-shaped cache.

The stream of `vllm bench serve --dataset-name prefix_repetition` with its
settings (16 prefixes of 1,024 tokens, each used 6 times in random order, a
64-token suffix, 64 output tokens; `grid_shapes.prefix_repetition`), through
the replay driver (`hybridkv.tools.replay`, no model), on Gemma-3-270M's KV
layout: 18 layers, 5 sliding (window 512) to 1 global, one KV head of 256,
float32 by default (`--dtype`; the block counts of vLLM's CPU engine at 180 MiB),
grouped by `KVCacheConfig.from_layer_specs` (one full-attention and five
sliding-window groups of 3 layers) and sized for 180 MiB of KV cache.

Each eviction policy replays it at block sizes 16 and 128 with 1, 2, 4 and 8
requests in flight, for several seeds; with `--vllm-python` the same streams
run through vLLM's own `KVCacheManager` (vLLM 0.32, its engine's default
sparse window retention, `prefix_cache_retention_interval=0`) in that Python,
on the same layout and block count.

    python benchmarks/bench_prefix_repetition.py [--policies lru,vllm-sparse,hybrid]
        [--seeds 0-2] [--vllm-python /work/venvs/vllm/bin/python] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import warnings
from typing import Any

from grid_shapes import prefix_repetition, with_concurrency
from vllm_policies import manager_settings

KV_BYTES = 180 * 2**20
LAYERS, PATTERN, WINDOW, HEAD_SIZE = 18, 6, 512, 256
DTYPES = ("float32", "bfloat16")
TOKEN_BUDGET = 8192
STREAM = dict(num_prefixes=16, prefix_len=1024, suffix_len=64)


def layer_kinds() -> list[str]:
    """Gemma 3's pattern: every sixth layer global, the others sliding."""
    return ["full" if (i + 1) % PATTERN == 0 else "swa" for i in range(LAYERS)]


def hybridkv_config(block_size: int, dtype: str):
    import torch

    from hybridkv import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec

    attn = dict(block_size=block_size, num_kv_heads=1, head_size=HEAD_SIZE,
                dtype=getattr(torch, dtype))
    specs = {f"layer.{i}": FullAttentionSpec(**attn) if k == "full"
             else SlidingWindowSpec(**attn, sliding_window=WINDOW)
             for i, k in enumerate(layer_kinds())}
    return KVCacheConfig.from_layer_specs(specs, KV_BYTES)


def run_hybridkv(policy: str, block_size: int, seed: int, in_flight: int,
                 dtype: str) -> dict[str, Any]:
    from hybridkv import KVCacheManager
    from hybridkv.tools.replay import ManagerAdapter, replay

    trace = with_concurrency(prefix_repetition(seed, **STREAM), in_flight)
    config = hybridkv_config(block_size, dtype)
    with manager_settings(policy):
        manager = KVCacheManager(config, eviction_policy=policy)
        stats = replay(trace.requests, ManagerAdapter(manager), max_running=in_flight,
                       max_batched_tokens=TOKEN_BUDGET)
    return {"hit": round(stats.hit_rate, 5), "num_blocks": config.num_blocks}


def run_vllm(block_size: int, seed: int, in_flight: int, num_blocks: int) -> dict[str, Any]:
    """In vLLM's Python: its KVCacheManager on the same layout (`--side vllm`)."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from vllm_adapter import VllmAdapter

    from hybridkv.tools.replay import replay

    attn = dict(block_size=block_size, num_kv_heads=1, head_size=HEAD_SIZE, dtype=torch.float32)
    kinds = layer_kinds()
    full = [f"layer.{i}" for i, k in enumerate(kinds) if k == "full"]
    swa = [f"layer.{i}" for i, k in enumerate(kinds) if k == "swa"]
    groups = [KVCacheGroupSpec(full, FullAttentionSpec(**attn))]
    groups += [KVCacheGroupSpec(swa[g:g + len(full)],
                                SlidingWindowSpec(**attn, sliding_window=WINDOW))
               for g in range(0, len(swa), len(full))]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    config.prefix_cache_retention_interval = 0  # the engine's default (CacheConfig)
    trace = with_concurrency(prefix_repetition(seed, **STREAM), in_flight)
    adapter = VllmAdapter(config, max_batched_tokens=TOKEN_BUDGET, max_model_len=65536)
    stats = replay(trace.requests, adapter, max_running=in_flight,
                   max_batched_tokens=TOKEN_BUDGET)
    return {"hit": round(stats.hit_rate, 5), "num_blocks": num_blocks}


def vllm_side(python: str, block_size: int, seed: int, in_flight: int,
              num_blocks: int) -> dict[str, Any]:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    out = subprocess.run([python, os.path.abspath(__file__), "--side-vllm",
                          f"{block_size},{seed},{in_flight},{num_blocks}"],
                         capture_output=True, text=True, env=env, timeout=1200, check=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="lru,vllm-sparse,hybrid")
    ap.add_argument("--seeds", default="0-2")
    ap.add_argument("--block-sizes", default="16,128")
    ap.add_argument("--in-flight", default="1,2,4,8")
    ap.add_argument("--dtype", choices=DTYPES, default="float32")
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--side-vllm", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def ints(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    warnings.simplefilter("ignore", RuntimeWarning)
    args = parse_args(argv)
    if args.side_vllm:
        bs, seed, in_flight, nb = map(int, args.side_vllm.split(","))
        print("RESULT " + json.dumps(run_vllm(bs, seed, in_flight, nb)))
        return {}
    policies = args.policies.split(",")
    rows = []
    for bs in ints(args.block_sizes):
        for in_flight in ints(args.in_flight):
            row: dict[str, Any] = {"block_size": bs, "in_flight": in_flight}
            for policy in policies:
                runs = [run_hybridkv(policy, bs, s, in_flight, args.dtype)
                        for s in ints(args.seeds)]
                row[policy] = round(statistics.mean(r["hit"] for r in runs), 4)
                row["num_blocks"] = runs[0]["num_blocks"]
            if args.vllm_python:
                runs = [vllm_side(args.vllm_python, bs, s, in_flight, row["num_blocks"])
                        for s in ints(args.seeds)]
                row["vllm"] = round(statistics.mean(r["hit"] for r in runs), 4)
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {"stream": STREAM, "kv_bytes": KV_BYTES, "dtype": args.dtype,
              "seeds": ints(args.seeds), "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
