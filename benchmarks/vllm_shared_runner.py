"""vLLM 0.32's KVCacheManager on the shared workload folder's trace and driver.

The vLLM side of `bench_vs_vllm_shared.py`, run under a Python that has vLLM
(see `bench_vs_vllm.py` for that environment). It imports `traces` from the
shared workload folder (`--shared-bench DIR`): the trace and the replay driver
the folder's `hybridkv_bench.py` runs hybridkv's manager with, and the knobs
it uses (2,000 requests, 4,096 blocks of 16 tokens, window 1,024, 64
running, 8,192 tokens per step, sha256). vLLM's manager is driven the way
its scheduler drives it (`vllm_adapter.py`). Per config it replays the trace
`--repeats` times on fresh managers and keeps the median run by requests/s,
as `hybridkv_bench.py` does, then prints `JSON: {...}` in the same shape.

    VENV/bin/python benchmarks/vllm_shared_runner.py --shared-bench DIR [--parts full,swa]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from common import add_replay_args

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = ("full", "swa", "mamba")


class SharedDriverEngine:
    """The shared driver's engine protocol over `VllmAdapter` (thin: every call
    but `clip_prefill_chunk` and `num_free_blocks` is timed by the driver)."""

    def __init__(self, adapter) -> None:
        self.adapter = adapter
        self.manager = adapter.manager

    def begin_step(self) -> None:
        self.manager.new_step_starts()

    def end_step(self) -> None:
        self.adapter.drain()

    def new_request(self, tr):
        return self.adapter.new_request(tr.request_id, tr.prompt_token_ids, tr.decode_steps)

    def lookup(self, req) -> int:
        return self.adapter.lookup(req)

    def clip_prefill_chunk(self, req, num_computed: int, num_new_tokens: int) -> int:
        clip = getattr(self.adapter, "clip_chunk", None)
        return num_new_tokens if clip is None else clip(req, num_new_tokens)

    def allocate_prefill(self, req, num_new_tokens: int) -> bool:
        return self.adapter.allocate(req, num_new_tokens)

    def append_token(self, req, token_id: int) -> None:
        req.append_output_token_ids(token_id)

    def allocate_decode(self, req) -> bool:
        return self.adapter.allocate(req, 1)

    def free(self, req) -> None:
        self.manager.free(req)

    def preempt(self, req) -> None:
        self.adapter.preempt(req)

    def num_free_blocks(self) -> int:
        return self.adapter.num_free_blocks


def bench_config(traces, kind: str, trace, args) -> dict:
    from vllm_adapter import VllmAdapter, make_vllm_config

    runs = []
    for _ in range(args.repeats):
        config = make_vllm_config(kind, args.num_blocks, args.window, args.block_size)
        adapter = VllmAdapter(config, max_batched_tokens=args.max_batched_tokens,
                              max_model_len=args.max_model_len, hash_algo=args.hash_algo)
        engine = SharedDriverEngine(adapter)
        result = traces.replay(trace, engine, max_running=args.max_running,
                               max_batched_tokens=args.max_batched_tokens)
        d = result.as_dict()
        d["manager_req_per_s"] = round(d["finished"] / d["managed_op_s"], 2) \
            if d["managed_op_s"] else 0
        d["leak_free"] = engine.num_free_blocks() == args.num_blocks - 1
        runs.append(d)
    runs.sort(key=lambda d: d["requests_per_s"])
    median = runs[len(runs) // 2]
    median["config"] = kind
    return median


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared-bench", required=True, metavar="DIR")
    ap.add_argument("--parts", default=",".join(CONFIGS))
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    add_replay_args(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in CONFIGS]
    if unknown:
        raise SystemExit(f"--parts: unknown config(s) {unknown}; use {', '.join(CONFIGS)}")
    if not os.path.isfile(os.path.join(args.shared_bench, "traces.py")):
        raise SystemExit(f"--shared-bench {args.shared_bench}: no traces.py there")
    sys.path.insert(0, os.path.abspath(args.shared_bench))
    sys.path.insert(0, HERE)
    import traces
    import vllm

    trace = traces.make_shared_prefix_trace(num_requests=args.num_requests)
    out: dict = {"vllm": vllm.__version__, "fingerprint": trace.fingerprint}
    for kind in parts:
        d = out[kind] = bench_config(traces, kind, trace, args)
        print(f"{kind:6s} req/s {d['requests_per_s']:9.1f}  manager-only "
              f"{d['manager_req_per_s']:9.1f}  hit {d['hit_rate']:.4f}  lookup "
              f"{d['lookup_mean_us']:.2f}us  free {d['free_mean_us']:.2f}us  "
              f"leak_free {d['leak_free']}", flush=True)
    print("JSON: " + json.dumps(out, sort_keys=True))
    return out


if __name__ == "__main__":
    main()
