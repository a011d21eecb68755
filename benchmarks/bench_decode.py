"""Decode step time of the engine alone, at two model sizes.

`--batch` requests (8 by default, as a server with 8 clients in flight) with
random 256-token prompts are prefilled, then decoded together; every decode
step is timed (`LLM.step` wall time, prefill steps excluded). Models:

- `tiny`: the gemma3-tiny preset re-made at head size 32 (what vLLM's CPU
  attention accepts);
- `270m`: the Gemma 3 270M shape (18 layers, 5 sliding : 1 global, window
  512, head size 256, one KV head, hidden 640, MLP 2,048) with the presets'
  vocabulary: about 100M parameters, random weights.

    python benchmarks/bench_decode.py --model tiny --repeats 3
    python benchmarks/bench_decode.py --model 270m --profile cprofile

Reports per-step medians and spread (p10/p90) and decode tokens/s per repeat,
into `--out DIR/decode_MODEL.json`. `--profile cprofile|torch` prints the
top entries of one extra run instead of timing.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

import torch
from common import add_common_args, prepare_out, write_result
from transformers import AutoModelForCausalLM

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import get_preset

GEMMA3_270M_SHAPE = {
    "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "query_pre_attn_scalar": 256, "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
}
MODELS = {"tiny": {"head_dim": 32}, "270m": GEMMA3_270M_SHAPE}


def build_model(name: str, seed: int = 0):
    """The random-weight gemma3 model `name` ("tiny" or "270m"), float32, eval mode."""
    config = get_preset("gemma3-tiny").build_config(**MODELS[name])
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def prompts(batch: int, prompt_len: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (prompt_len,), generator=g).tolist() for _ in range(batch)]


def decode_step_times(llm: LLM, batch: list[list[int]], max_tokens: int,
                      cpu_times: list[float] | None = None) -> list[float]:
    """Wall time of every step of `batch` that only decodes (and, into `cpu_times`, the
    process's CPU time of each: on a shared machine, the part a busy core does not add)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for p in batch:
        llm.add_request(p, params)
    times = []
    while llm.has_unfinished_requests():
        decoding = all(s.request.num_computed_tokens >= s.request.num_prompt_tokens
                       for s in llm.scheduler.running) and not llm.scheduler.waiting
        t0, c0 = time.perf_counter(), time.process_time()
        llm.step()
        if decoding:
            times.append(time.perf_counter() - t0)
            if cpu_times is not None:
                cpu_times.append(time.process_time() - c0)
    return times


def summary(times: list[float], batch: int, cpu_times: list[float] | None = None) -> dict:
    q = statistics.quantiles(times, n=10)
    med = statistics.median(times)
    out = {"steps": len(times), "step_ms_median": med * 1e3, "step_ms_p10": q[0] * 1e3,
           "step_ms_p90": q[-1] * 1e3, "tokens_per_s": batch / med}
    if cpu_times:
        out["cpu_ms_median"] = statistics.median(cpu_times) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small-step-threads", default="auto",
                    help="threads for decode-sized steps ('auto': the engine's choice by model "
                         "size, the default; 'none': torch's setting)")
    ap.add_argument("--compare-attention", action="store_true",
                    help="alternate decode steps between the fused decode attention and the "
                         "tiled path it replaced, in one process; report both")
    ap.add_argument("--no-prepack", action="store_true",
                    help="LLM(prepack_weights=False): linear weights unpacked")
    ap.add_argument("--profile", choices=["cprofile", "torch"], default=None)
    add_common_args(ap)
    args = ap.parse_args()
    out = prepare_out(args.out)
    if args.quick:
        args.repeats, args.max_tokens = 1, 16
    torch.set_num_threads(int(os.environ.get("HYBRIDKV_BENCH_THREADS", torch.get_num_threads())))
    extra = {"prepack_weights": False} if args.no_prepack else {}
    llm = LLM(build_model(args.model), block_size=args.block_size,
              kv_cache_memory_bytes=1 << 30, **extra)
    if args.small_step_threads != "auto":
        llm.executor.small_step_threads = (None if args.small_step_threads == "none"
                                           else int(args.small_step_threads))
    vocab = llm.runner.vocab_size
    decode_step_times(llm, prompts(args.batch, args.prompt_len, vocab, 99), 8)  # warm up
    if args.profile:
        run_profile(llm, args, vocab)
        return
    if args.compare_attention:
        compare_attention(llm, args, vocab, out)
        return
    runs = []
    for r in range(args.repeats):
        llm.kv.reset_prefix_cache()
        cpu: list[float] = []
        runs.append(summary(decode_step_times(
            llm, prompts(args.batch, args.prompt_len, vocab, r), args.max_tokens, cpu),
            args.batch, cpu))
        print(f"repeat {r}: {runs[-1]}", flush=True)
    result = {"model": args.model, "batch": args.batch, "prompt_len": args.prompt_len,
              "max_tokens": args.max_tokens, "block_size": args.block_size,
              "threads": torch.get_num_threads(),
              "small_step_threads": args.small_step_threads,
              "load_average": os.getloadavg(), "runs": runs,
              "step_ms_median": statistics.median(r["step_ms_median"] for r in runs),
              "cpu_ms_median": statistics.median(r["cpu_ms_median"] for r in runs),
              "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in runs)}
    print(write_result(f"decode_{args.model}", result, out))
    print(f"median step {result['step_ms_median']:.2f} ms "
          f"(CPU {result['cpu_ms_median']:.2f} ms), "
          f"{result['tokens_per_s_median']:.1f} tokens/s")


def compare_attention(llm: LLM, args, vocab: int, out: str) -> None:
    """Even decode steps on the fused decode path, odd ones on the tiled path (same batch)."""
    from hybridkv.kernels import attention

    fused = attention.is_decode_batch
    times: dict[str, list[float]] = {"fused": [], "tiled": []}
    for r in range(args.repeats):
        for p in prompts(args.batch, args.prompt_len, vocab, 100 + r):
            llm.add_request(p, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
        llm.step()  # the prefill
        step = 0
        while llm.has_unfinished_requests():
            name = "fused" if step % 2 == 0 else "tiled"
            attention.is_decode_batch = fused if name == "fused" else _never  # type: ignore
            t0 = time.perf_counter()
            llm.step()
            times[name].append(time.perf_counter() - t0)
            step += 1
    attention.is_decode_batch = fused
    result = {name: summary(t, args.batch) for name, t in times.items()}
    result.update(model=args.model, batch=args.batch, prompt_len=args.prompt_len,
                  threads=torch.get_num_threads(), load_average=os.getloadavg())
    print(write_result(f"decode_attention_{args.model}", result, out))
    for name in ("fused", "tiled"):
        print(name, result[name])


def _never(*args) -> bool:
    return False


def run_profile(llm: LLM, args, vocab: int) -> None:
    batch = prompts(args.batch, args.prompt_len, vocab, 7)
    if args.profile == "cprofile":
        prof = cProfile.Profile()
        prof.enable()
        decode_step_times(llm, batch, args.max_tokens)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode_step_times(llm, batch, args.max_tokens)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
