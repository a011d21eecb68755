"""Hit rate under memory pressure: the shared pressure workloads (../shared/bench).

Runs `pressure_bench.py` of the shared workload folder for the given eviction
policies (default: lru and hybrid) and writes benchmarks/results/pressure.json.

    python benchmarks/bench_pressure.py [--policies lru,hybrid] [--small]
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
    ap.add_argument("--policies", default="lru,hybrid")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args(argv)
    runner = os.path.join(shared_bench_dir(), "pressure_bench.py")
    result = {}
    for policy in args.policies.split(","):
        cmd = [sys.executable, runner, "--eviction-policy", policy] + (["--small"] * args.small)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        print(f"== eviction_policy={policy}")
        for line in out.splitlines():
            if not line.startswith("JSON: "):
                print(line)
        result[policy] = json.loads(out.split("JSON: ", 1)[1])
    print("wrote", write_result("pressure", {"pressure": result}))
    return result


if __name__ == "__main__":
    main()
