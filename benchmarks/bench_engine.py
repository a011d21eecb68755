"""End-to-end engine benchmark on a shared-document workload.

Every request is one shared document (2,048 tokens by default) plus a unique
32-token question, and generates 16 tokens. Measured on CPU for one preset:

- TTFT miss: a request whose document is not cached;
- TTFT hit: a request whose document is cached (only the question is new);
- suffix alone: the same engine computing a 32-token prompt with no context,
  the yardstick the hit should approach;
- requests/s with prefix caching on and off (same engine settings), and the
  Hugging Face model's own `generate` (one request at a time, its own cache).

    python benchmarks/bench_engine.py --preset gemma3-tiny
    python benchmarks/bench_engine.py --preset jamba-tiny --num-requests 16

Results go to `--out DIR/engine_PRESET.json` (default ./hybridkv-bench-output);
`--quick` runs 9 short requests once.

`--config-overrides` changes the preset's shape (JSON of config values), e.g. a model with
Gemma 3 1B's proportions at a quarter of its width (5 sliding layers of window 512 per
global one, one kv head, MLP 6x wide):

    python benchmarks/bench_engine.py --preset gemma3-tiny --throughput-repeats 0 \
        --config-overrides '{"hidden_size": 256, "intermediate_size": 1536,
        "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 512,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
        "sliding_attention", "sliding_attention", "full_attention",
        "sliding_attention", "sliding_attention", "sliding_attention",
        "sliding_attention", "sliding_attention", "full_attention"]}'

It also takes a JSON file: `configs/gemma3_1b_dims.json` is Gemma 3 1B at its real dimensions
(26 layers, hidden 1,152, head_dim 256, 262k vocabulary; random weights, about 4 GB), whose
KV cache needs a larger budget than the default:

    python benchmarks/bench_engine.py --preset gemma3-tiny --repeats 5 --throughput-repeats 0 \
        --kv-cache-bytes 1500000000 --config-overrides benchmarks/configs/gemma3_1b_dims.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from common import add_common_args, prepare_out, write_result

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import build_preset_model, get_preset


def make_workload(num_requests: int, doc_len: int, question_len: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    doc = torch.randint(3, vocab, (doc_len,), generator=g).tolist()
    questions = [torch.randint(3, vocab, (question_len,), generator=g).tolist()
                 for _ in range(num_requests)]
    return doc, questions


def timed_generate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> float:
    """Seconds one generate call takes."""
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - t0


def first_token(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[float, float]:
    """(time to first token, seconds of the whole generate call) of one prompt.

    TTFT runs from the call (prompt checks included) to the sampled token, as the
    engine records it (`RequestOutput.metrics`); the call also frees the request's
    blocks and builds its output."""
    t0 = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    call = time.perf_counter() - t0
    assert out.metrics is not None
    return out.metrics.time_to_first_token, call


def ttft(model, doc, questions, args) -> dict:
    """Median time to the first token: miss, hit, and the suffix alone.

    The hit and the suffix alone are each timed right after the same untimed 32-token
    request on their engine, so both start from the same recent history. The first hit
    straight after the document's miss is reported too (`ttft_hit_after_miss_s`): the
    miss's 2,080-token step sweeps the CPU caches, which slows whatever request comes
    next (a hit or not) by a further 0.4-0.9 ms on this machine. `call_*` are the same
    requests' whole generate() calls (TTFT plus freeing and the output).
    """
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    warm_up = [doc[-args.question_len:]]  # a prompt timed nowhere, sharing no cached block
    runs: dict[str, list[tuple[float, float]]] = {"miss": [], "after_miss": [], "hit": [],
                                                  "alone": []}
    for i in range(args.repeats):
        llm = LLM(model, block_size=args.block_size, max_num_batched_tokens=args.chunk,
                  kv_cache_memory_bytes=args.kv_cache_bytes)
        warm = LLM(model, block_size=args.block_size, max_num_batched_tokens=args.chunk,
                   kv_cache_memory_bytes=args.kv_cache_bytes)
        # (warming up with a timed question would leave its first block cached)
        warm.generate(warm_up, one)
        runs["alone"].append(first_token(warm, questions[i % len(questions)], one))
        runs["miss"].append(first_token(llm, doc + questions[0], one))
        runs["after_miss"].append(first_token(llm, doc + questions[1 + i % 8], one))
        llm.generate(warm_up, one)
        runs["hit"].append(first_token(llm, doc + questions[1 + (i + 4) % 8], one))
    median = statistics.median
    ttfts = {k: median(t for t, _ in v) for k, v in runs.items()}
    calls = {k: median(c for _, c in v) for k, v in runs.items()}
    return {"ttft_miss_s": ttfts["miss"], "ttft_hit_s": ttfts["hit"],
            "suffix_alone_s": ttfts["alone"], "hit_over_suffix": ttfts["hit"] / ttfts["alone"],
            "ttft_hit_after_miss_s": ttfts["after_miss"],
            "hit_after_miss_over_suffix": ttfts["after_miss"] / ttfts["alone"],
            "call_hit_s": calls["hit"], "call_suffix_alone_s": calls["alone"],
            "call_hit_over_suffix": calls["hit"] / calls["alone"]}


def throughput(model, doc, questions, args) -> dict:
    """Requests/s with caching on and off: medians of `--throughput-repeats` runs of
    each, alternated (a single sub-second run is at the mercy of the machine)."""
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    prompts = [doc + q for q in questions]
    out = {}
    runs: dict[bool, list[float]] = {True: [], False: []}
    hit_rate = {}
    for _ in range(args.throughput_repeats):
        for caching in (True, False):
            llm = LLM(model, enable_prefix_caching=caching, block_size=args.block_size,
                      max_num_batched_tokens=args.chunk, max_num_seqs=args.max_num_seqs,
                      kv_cache_memory_bytes=args.kv_cache_bytes)
            runs[caching].append(len(prompts) / timed_generate(llm, prompts, params))
            hit_rate[caching] = llm.stats.prefix_hit_rate
    for caching in (True, False):
        out["on" if caching else "off"] = {"requests_per_s": statistics.median(runs[caching]),
                                           "runs": runs[caching], "hit_rate": hit_rate[caching]}
    hf_n = min(args.hf_requests, len(prompts))
    t0 = time.perf_counter()
    for p in prompts[:hf_n]:
        model.generate(torch.tensor([p]), max_new_tokens=args.output_len,
                       min_new_tokens=args.output_len, do_sample=False)
    seconds = time.perf_counter() - t0
    out["hf_generate"] = {"requests_per_s": hf_n / seconds}
    out["on_over_off"] = out["on"]["requests_per_s"] / out["off"]["requests_per_s"]
    out["on_over_hf"] = out["on"]["requests_per_s"] / out["hf_generate"]["requests_per_s"]
    return out


def build_model(args):
    """The preset's model, with `--config-overrides` applied to its config when given."""
    if not args.config_overrides:
        return build_preset_model(args.preset, seed=args.seed)
    from transformers import AutoModelForCausalLM

    text = args.config_overrides
    if os.path.isfile(text):
        with open(text) as f:
            text = f.read()
    config = get_preset(args.preset).build_config(**json.loads(text))
    torch.manual_seed(args.seed)
    return AutoModelForCausalLM.from_config(config).eval()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gemma3-tiny")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--doc-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=4096, help="max tokens per step")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--throughput-repeats", type=int, default=3, help="0: skip throughput")
    ap.add_argument("--hf-requests", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-cache-bytes", type=int, default=None,
                    help="KV cache memory per engine (default: the engine's)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: one per core; 1 is steadier on a shared machine)")
    ap.add_argument("--config-overrides", default=None,
                    help="JSON of config values replacing the preset's (another model shape), "
                         "or a file holding it")
    ap.add_argument("--json-out", default=None, help="name of the JSON file in --out "
                    "(default: engine_PRESET.json)")
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    if args.quick:  # a few small requests, one repeat: seconds
        args.num_requests, args.doc_len, args.question_len, args.output_len = 9, 256, 16, 2
        args.repeats, args.throughput_repeats, args.hf_requests = 1, 1, 1
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    model = build_model(args)
    doc, questions = make_workload(args.num_requests, args.doc_len, args.question_len,
                                   model.config.vocab_size, args.seed)
    result = {"preset": args.preset, "config": vars(args), "torch": torch.__version__}
    result["ttft"] = ttft(model, doc, questions, args)
    print(json.dumps(result["ttft"]), flush=True)
    if args.throughput_repeats > 0:
        result["throughput"] = throughput(model, doc, questions, args)
        print(json.dumps(result["throughput"]), flush=True)
    name = f"engine_{args.preset}" + ("_overrides" if args.config_overrides else "")
    if args.json_out:
        name = os.path.splitext(os.path.basename(args.json_out))[0]
    print("wrote", write_result(name, result, args.out))
    return result


if __name__ == "__main__":
    main()
