"""One engine step at a time, hybridkv's engine or vLLM's offline engine, on one checkpoint.

Run it with the interpreter of the engine to time (vLLM's from its venv):

    python benchmarks/bench_step_vs_vllm.py --engine hybridkv --checkpoint CKPT
    OMP_NUM_THREADS=1 VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 \\
        /work/venvs/vllm/bin/python benchmarks/bench_step_vs_vllm.py --engine vllm --checkpoint CKPT
    python benchmarks/bench_step_vs_vllm.py --engine hybridkv --alternate-decode-kernel

Scenarios (fixed seeds, one compute thread, greedy):

- `decode`: 8 prompts of 576 random tokens prefilled, then decoded together for 40 tokens;
  every decode step timed (the last 30);
- `suffix`: 4 prefixes of 512 tokens cached, then one step that prefills 8 prompts of
  prefix + 82 new tokens (the `prefix_repetition` workload's second wave), twice.

Each step's wall time and the process's CPU time are printed (vLLM runs in-process:
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `--enforce-eager`, block size 128, 1 GiB of KV).
`--alternate-decode-kernel` (hybridkv only) alternates decode steps between the C decode
attention kernel and the gather + SDPA path in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

CHECKPOINT = "/tmp/vsvllm_270/checkpoints/gemma3-270m-shape"
VOCAB = 512


class Engine:
    """add(prompt, max_tokens) / step() / busy() over either engine."""

    def __init__(self, name: str, checkpoint: str) -> None:
        self.name, self.count = name, 0
        if name == "hybridkv":
            from hybridkv import LLM, SamplingParams
            self.llm, self.params = LLM(checkpoint, dtype=torch.float32,
                                        kv_cache_memory_bytes=1 << 30), SamplingParams
            return
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM as VLLM
        from vllm import SamplingParams as VParams
        self.llm = VLLM(checkpoint, dtype="float32", enforce_eager=True, block_size=128,
                        gpu_memory_utilization=0.3, max_model_len=4096, max_num_seqs=32,
                        enable_prefix_caching=True, max_num_batched_tokens=2048)
        self.params = VParams

    def add(self, prompt: list[int], max_tokens: int) -> None:
        if self.name == "hybridkv":
            self.llm.add_request(prompt, self.params(max_tokens=max_tokens, ignore_eos=True))
            return
        from vllm.inputs import TokensPrompt
        self.count += 1
        self.llm.llm_engine.add_request(
            f"r{self.count}", TokensPrompt(prompt_token_ids=prompt),
            self.params(max_tokens=max_tokens, ignore_eos=True, temperature=0))

    def step(self) -> tuple[float, float]:
        """(wall ms, CPU ms) of one step."""
        c0, t0 = time.process_time(), time.perf_counter()
        if self.name == "hybridkv":
            self.llm.step()
        else:
            self.llm.llm_engine.step()
        return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3

    def busy(self) -> bool:
        if self.name == "hybridkv":
            return self.llm.has_unfinished_requests()
        return self.llm.llm_engine.has_unfinished_requests()


def random_prompts(count: int, length: int, g: torch.Generator) -> list[list[int]]:
    return [torch.randint(3, VOCAB, (length,), generator=g).tolist() for _ in range(count)]


def run_all(engine: Engine, prompts: list[list[int]], max_tokens: int,
            before_step=None) -> list[tuple[float, float]]:
    for prompt in prompts:
        engine.add(prompt, max_tokens)
    steps = []
    while engine.busy():
        if before_step is not None:
            before_step(len(steps))
        steps.append(engine.step())
    return steps


def medians(steps: list[tuple[float, float]]) -> dict:
    return {"steps": len(steps), "wall_ms": statistics.median(w for w, _ in steps),
            "cpu_ms": statistics.median(c for _, c in steps)}


def decode(engine: Engine) -> dict:
    g = torch.Generator().manual_seed(3)
    run_all(engine, random_prompts(8, 576, g), 40)  # warm-up
    return medians(run_all(engine, random_prompts(8, 576, g), 40)[-30:])


def suffix(engine: Engine) -> dict:
    g = torch.Generator().manual_seed(5)
    prefixes = random_prompts(4, 512, g)
    run_all(engine, [p + [5] * 8 for p in prefixes], 1)
    out = {}
    for r in range(2):
        prompts = [p + t for p, t in zip(prefixes * 2, random_prompts(8, 82, g))]
        out[f"run{r}"] = run_all(engine, prompts, 1)
    return out


def alternate_decode_kernel(engine: Engine) -> dict:
    from hybridkv.kernels import decode_native
    kernel = decode_native._decode_attn
    names = ("kernel", "gather+sdpa")
    times: dict[str, list] = {name: [] for name in names}

    def switch(step: int) -> None:  # steps 0-2 prefill; then alternate
        decode_native._decode_attn = kernel if step % 2 == 0 else None

    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        steps = run_all(engine, random_prompts(8, 576, g), 33, switch)
        for i, step in enumerate(steps[4:], start=4):
            times[names[i % 2]].append(step)
    decode_native._decode_attn = kernel
    return {name: medians(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["hybridkv", "vllm"], default="hybridkv")
    ap.add_argument("--checkpoint", default=CHECKPOINT)
    ap.add_argument("--scenarios", default="decode,suffix")
    ap.add_argument("--alternate-decode-kernel", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = Engine(args.engine, args.checkpoint)
    torch.set_num_threads(1)
    result: dict = {"engine": args.engine, "load_average": os.getloadavg()}
    if args.alternate_decode_kernel:
        result["alternate"] = alternate_decode_kernel(engine)
    else:
        for name in args.scenarios.split(","):
            result[name] = {"decode": decode, "suffix": suffix}[name](engine)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
