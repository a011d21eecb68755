"""The scheduler-path replay of the shared workload (../shared/bench) on full, swa and mamba.

Runs the shared runner `hybridkv_bench.py` (2,000 requests: 1,024-token shared
prefix + 256 unique tokens + 64 decode steps; 4,096 blocks of 16 tokens) and
writes benchmarks/results/replay.json.

    python benchmarks/bench_replay.py [--parts full,swa,mamba] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import shared_bench_dir, write_result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="hash,full,swa,mamba")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    runner = os.path.join(shared_bench_dir(), "hybridkv_bench.py")
    out = subprocess.run([sys.executable, runner, "--parts", args.parts,
                          "--repeats", str(args.repeats)],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if not line.startswith("JSON: "):
            print(line)
    result = json.loads(out.split("JSON: ", 1)[1])
    print("wrote", write_result("replay", {"replay": result, "args": vars(args)}))
    return result


if __name__ == "__main__":
    main()
