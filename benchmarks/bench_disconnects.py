"""64 concurrent streaming clients, a quarter hanging up at random points, several rounds.

Starts `hybridkv serve PRESET --max-num-seqs S` and runs `--rounds` rounds of
`--clients` concurrent streamed completions (hybridkv.tools.disconnects):
a random quarter close their connection after a random number of events, 0
included (most of those while queued). After each round it waits until the
server is idle and records the KV blocks held, the requests running and
waiting, and the server's resident memory. Writes DIR/disconnects.json
(`--out DIR`); exit code 1 when a kept request did not finish, a block
stayed held or the server became unhealthy.

    python benchmarks/bench_disconnects.py --out /tmp/disconnects [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
from bench_vllm_client import free_port, start_server
from prometheus_client.parser import text_string_to_metric_families

from hybridkv.tools.disconnects import problems, rss_bytes, run_round


def idle_metrics(url: str, timeout: float = 60.0) -> dict[str, float]:
    """Poll /metrics until nothing runs, waits or holds a block (or `timeout`)."""
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting",
             "hybridkv_kv_cache_blocks_held")
    deadline = time.monotonic() + timeout
    while True:
        values = {}
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
            for sample in family.samples:
                if sample.name in names:
                    values[sample.name] = sample.value
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hybridkv-bench-output/disconnects")
    parser.add_argument("--preset", default="gemma3-tiny")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args.preset, port, out / "server.log",
                          ["--threads", "1", "--max-num-seqs", str(args.max_num_seqs),
                           "--max-queue", str(args.clients)])
    rounds, bad = [], []
    try:
        for seed in range(args.rounds):
            start = time.perf_counter()
            outcomes = asyncio.run(run_round(url, model=args.preset, num_clients=args.clients,
                                             max_tokens=args.max_tokens, seed=seed))
            wall = time.perf_counter() - start
            metrics = idle_metrics(url)
            issues = problems(outcomes, args.max_tokens)
            healthy = httpx.get(f"{url}/health").status_code == 200
            rounds.append({"round": seed, "seconds": round(wall, 2),
                           "hung_up": sum(o.hung_up for o in outcomes),
                           "hung_up_before_first_event": sum(o.hung_up and o.events == 0
                                                             for o in outcomes),
                           "finished": sum(o.finish_reason == "length" for o in outcomes),
                           "problems": issues[:5], "healthy": healthy,
                           "rss_mib": round(rss_bytes(server.pid) / (1 << 20), 1), **metrics})
            bad += issues + ([] if healthy else ["unhealthy"])
            bad += [f"round {seed}: {k}={v}" for k, v in metrics.items() if v]
    finally:
        server.terminate()
        server.wait(60)
    result = {"preset": args.preset, "clients": args.clients, "max_tokens": args.max_tokens,
              "max_num_seqs": args.max_num_seqs, "load_average": os.getloadavg(),
              "server_exit_code": server.returncode, "rounds": rounds, "problems": bad[:20]}
    (out / "disconnects.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 1 if bad or server.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
