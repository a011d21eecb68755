"""The `hybridkv` command line: demo, simulate, bench."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hybridkv` console script; returns the exit code."""
    parser = argparse.ArgumentParser(prog="hybridkv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="show prefix caching on hybrid models")
    demo.add_argument("--quick", action="store_true", help="bookkeeping example only")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from hybridkv.demo import run_demo

            return run_demo(quick=args.quick)
    except (ValueError, FileNotFoundError) as e:
        print(f"hybridkv {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
