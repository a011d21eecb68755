"""Soak the KVCacheManager fuzz machine (tests/support/fuzz.py) for a given time.

Runs fresh random examples of the stateful machine over every config and
both eviction policies until the time is up; prints the examples run, the
rule steps and the violations found (each with hypothesis's minimal failing
program), and writes DIR/soak.json (`--out DIR`).

    python benchmarks/soak.py --minutes 5 [--configs full,sliding] [--examples-per-run 50]
        [--out DIR] [--quick]

Exit code 1 when a violation was found. The machine is the test suite's, so this
needs the test extra (`pip install -e ".[test]"`: hypothesis).
"""

from __future__ import annotations

import argparse
import os
import sys

from common import add_common_args, prepare_out, write_result

from hybridkv.tools.spec_mixes import CONFIGS

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from support.fuzz import run_fuzz  # noqa: E402 - the test suite's machine


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated config names (default: all)")
    ap.add_argument("--examples-per-run", type=int, default=50)
    ap.add_argument("--steps", type=int, default=50, help="rule steps per example (at most)")
    add_common_args(ap)
    args = ap.parse_args(argv)
    prepare_out(args.out)
    if args.quick:
        args.minutes, args.examples_per_run = 0.05, 10
    if not args.minutes > 0:
        ap.error(f"--minutes must be > 0, got {args.minutes}")
    names = [n for n in args.configs.split(",") if n]
    result = run_fuzz(args.minutes * 60, config_names=names,
                      examples_per_run=args.examples_per_run, steps=args.steps)
    stats = result.stats
    print(f"soak: {result.seconds / 60:.1f} min, {result.runs} runs, {stats.examples} examples, "
          f"{stats.steps} steps, {len(result.violations)} violations")
    print(f"  lookups {stats.lookups} (hits {stats.hits}, {stats.hit_tokens} tokens), "
          f"allocations {stats.allocations} (refused {stats.refusals}), "
          f"decoded tokens {stats.decoded_tokens}, preemptions {stats.preemptions}, "
          f"evicted ids {stats.explicit_evictions}, resets {stats.resets}")
    for text in result.violations:
        print("VIOLATION:", text)
    path = write_result("soak", {
        "args": vars(args), "seconds": round(result.seconds, 1), "runs": result.runs,
        "stats": stats.as_dict(), "num_violations": len(result.violations),
        "violations": result.violations,
    }, args.out)
    print("wrote", path)
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
