"""The engine on a CUDA device: parity with Hugging Face, a hit's TTFT, decode speed.

One script, one JSON out. On a CUDA machine (CPU works too, for a dry run):

    python benchmarks/gpu_check.py --out gpu_check.json [--device cuda] [--quick]

1. Greedy parity, every preset: `LLM.generate` (caching on, then off) against
   the Hugging Face model's own greedy decoding (a full forward per token, no
   cache), on prompts sharing prefixes longer than the windows and chunks, so
   that hits happen in every group. float32, TF32 off, so both sides compute
   the same sums. Mamba presets get slowly decaying states (a dropped state
   would then show). Kernels: the torch-native paths, plus flash-attn /
   mamba-ssm where they import (reported).
2. At a Gemma-3-270M shape (18 layers, 5 sliding : 1 global, window 512, head
   size 256, one KV head, bf16): time to first token of a 2,048-token prompt
   on a miss (empty cache) and on a hit (the same document, a new question),
   and decode tokens/s of a batch of requests. Each figure: a warm-up, then
   the median and range of `--repeats` runs; CUDA is synchronized around
   every timing.

Each check is isolated: one that raises is recorded with its error and the
others still run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import build_preset_model, get_preset, list_presets
from hybridkv.testing.models import slow_decay

MAMBA_PRESETS = ("jamba-tiny", "nemotron-h-tiny")
PARITY_TOKENS = 8
SHAPE_270M: dict[str, Any] = {
    "num_hidden_layers": 18, "hidden_size": 640, "intermediate_size": 2048,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "sliding_window": 512, "query_pre_attn_scalar": 256, "max_position_embeddings": 8192,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure")
    p.add_argument("--quick", action="store_true",
                   help="fewer presets, a shorter document, fewer repeats (a dry run)")
    return p.parse_args(argv)


def environment(device: str) -> dict[str, Any]:
    import transformers

    from hybridkv.kv_cache import fastpath

    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "device": device,
        "flash_attn": importlib.util.find_spec("flash_attn") is not None,
        "mamba_ssm": importlib.util.find_spec("mamba_ssm") is not None,
        "causal_conv1d": importlib.util.find_spec("causal_conv1d") is not None,
        "kv_cache_fastpath": fastpath.fastpath_backend().c_extension,
    }
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   cuda=torch.version.cuda)
    return env


def shared_prefix_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    """Five prompts, four sharing 104 tokens (past every preset's 32-token window)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(3, vocab, (120,), generator=g).tolist()
    return [base[:104] + [5, 6, 7], base[:104] + [9], base[:61], base, base[:104] + [5, 6, 7]]


def hf_greedy(model, prompt: list[int], num_tokens: int) -> list[int]:
    """Hugging Face's greedy tokens: a full forward over the sequence so far per token,
    no cache (never its cached continuation), on the model's device."""
    tokens = list(prompt)
    device = next(model.parameters()).device
    with torch.no_grad():
        for _ in range(num_tokens):
            ids = torch.tensor([tokens], device=device)
            tokens.append(int(torch.argmax(model(ids, use_cache=False).logits[0, -1])))
    return tokens[len(prompt):]


def check_parity(name: str, device: str) -> dict[str, Any]:
    model = build_preset_model(name, seed=0)
    if name in MAMBA_PRESETS:
        slow_decay(model)
    model = model.to(device)
    prompts = shared_prefix_prompts(model.config.vocab_size)
    expected = [hf_greedy(model, p, PARITY_TOKENS) for p in prompts]
    params = SamplingParams(max_tokens=PARITY_TOKENS, ignore_eos=True)
    result: dict[str, Any] = {}
    for caching in (True, False):
        llm = LLM(model, enable_prefix_caching=caching, block_size=8, num_blocks=160,
                  device=device)
        outs = llm.generate(prompts, params)
        got = [o.output_token_ids for o in outs]
        key = "caching_on" if caching else "caching_off"
        result[key] = {
            "identical": got == expected,
            "mismatched_prompts": [i for i, (a, b) in enumerate(zip(got, expected)) if a != b],
            "cached_tokens": [o.num_cached_tokens for o in outs],
        }
    return result


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(torch.device(device))


def timed_generate(device: str, llm: LLM, prompts: list[list[int]], params: SamplingParams
                   ) -> tuple[float, list]:
    """(seconds, outputs) of one `llm.generate`, the device synchronized around it."""
    synchronize(device)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    synchronize(device)
    return time.perf_counter() - start, outs


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values)}


def build_270m(device: str):
    from transformers import AutoModelForCausalLM

    config = get_preset("gemma3-tiny").build_config(**SHAPE_270M)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).to(device).eval()
    params = sum(p.numel() for p in model.parameters())
    return model, params


def check_270m(device: str, doc_len: int, repeats: int, decode_shape: tuple[int, int, int]
               ) -> dict[str, Any]:
    model, num_params = build_270m(device)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    document = torch.randint(3, vocab, (doc_len,), generator=g).tolist()
    one = SamplingParams(max_tokens=1, ignore_eos=True)

    def fresh_llm() -> LLM:
        return LLM(model, kv_cache_memory_bytes=2 << 30, device=device, max_num_seqs=64,
                   max_num_batched_tokens=max(4096, doc_len + 64))

    def question(i: int) -> list[int]:
        return document + torch.randint(3, vocab, (24,), generator=g).tolist() + [i % vocab]

    misses, hits, hit_tokens = [], [], []
    for run in range(repeats + 1):  # run 0 warms up
        llm = fresh_llm()
        miss, _ = timed_generate(device, llm, [question(2 * run)], one)
        hit, outs = timed_generate(device, llm, [question(2 * run + 1)], one)
        if run:
            misses.append(miss)
            hits.append(hit)
            hit_tokens.append(outs[0].num_cached_tokens)
    decode = measure_decode(fresh_llm(), device, vocab, repeats, *decode_shape)
    return {"parameters": num_params, "document_tokens": doc_len,
            "ttft_miss_s": summary(misses), "ttft_hit_s": summary(hits),
            "hit_cached_tokens": hit_tokens,
            "hit_speedup": statistics.median(misses) / statistics.median(hits), **decode}


def measure_decode(llm: LLM, device: str, vocab: int, repeats: int,
                   batch: int = 16, prompt_len: int = 128, new_tokens: int = 128
                   ) -> dict[str, Any]:
    g = torch.Generator().manual_seed(2)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    rates = []
    for run in range(repeats + 1):
        prompts = [torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
                   for _ in range(batch)]
        prefill = SamplingParams(max_tokens=1, ignore_eos=True)
        llm.generate(prompts, prefill)  # caches the prompts: both timed runs below hit
        t_prefill, _ = timed_generate(device, llm, prompts, prefill)
        t_all, _ = timed_generate(device, llm, prompts, params)
        if run:  # decode time: the whole run minus the same (cached) prefill and first token
            rates.append(batch * (new_tokens - 1) / max(t_all - t_prefill, 1e-9))
    return {"decode_batch": batch, "decode_new_tokens": new_tokens,
            "decode_tokens_per_s": summary(rates)}


def run_check(results: dict[str, Any], key: str, fn) -> None:
    start = time.perf_counter()
    try:
        results[key] = fn()
    except Exception as exc:  # recorded, and the other checks still run
        results[key] = {"error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc(limit=8)}
    results[key]["seconds"] = round(time.perf_counter() - start, 2)
    print(f"{key}: {json.dumps(results[key])[:300]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    repeats = 1 if args.quick else args.repeats
    decode_shape = (2, 32, 8) if args.quick else (16, 128, 128)  # batch, prompt, new tokens
    presets = ["gemma3-tiny"] if args.quick else list_presets()
    results: dict[str, Any] = {"environment": environment(args.device), "parity": {}}
    for name in presets:
        run_check(results["parity"], name, lambda name=name: check_parity(name, args.device))
    run_check(results, "gemma3_270m_shape",
              lambda: check_270m(args.device, 256 if args.quick else 2048, repeats,
                                 decode_shape))
    parity = results["parity"].values()
    results["all_parity_identical"] = all(
        r.get("caching_on", {}).get("identical") and r.get("caching_off", {}).get("identical")
        for r in parity)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}; parity identical on every preset: "
          f"{results['all_parity_identical']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
