"""`/health` latency while oversized prompts are being refused.

Starts `hybridkv serve PRESET`, polls `/health` every 10 ms from a thread,
and meanwhile sends `--repeats` completions whose text prompt is `--mb`
megabytes (each refused with a 400 naming `--max-prompt-chars`, before any
tokenizing). Reports /health latency percentiles with and without the big
requests (the same poller, alternating idle and loaded windows) and how long
each refusal took; writes DIR/health_oversized.json (`--out DIR`).

    python benchmarks/bench_health_oversized.py --out /tmp/health [--mb 7] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
from bench_vllm_client import free_port, start_server


class Poller(threading.Thread):
    """GET /health every `interval` seconds; latencies (ms) into the current bucket."""

    def __init__(self, url: str, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.buckets: dict[str, list[float]] = {"idle": [], "loaded": []}
        self.bucket = "idle"
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stopped.is_set():
                start = time.perf_counter()
                status = client.get(f"{self.url}/health").status_code
                elapsed = (time.perf_counter() - start) * 1000
                assert status == 200, f"/health answered {status}"
                self.buckets[self.bucket].append(elapsed)
                time.sleep(self.interval)


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 2),
            "p99_ms": round(pick(0.99), 2), "max_ms": round(ordered[-1], 2)}


def refuse_once(url: str, body: bytes) -> tuple[int, float, str]:
    """Send `body` from a child process (its sending must not slow the poller's
    process) and return (status, seconds, error message)."""
    with multiprocessing.Pool(1) as pool:
        return pool.apply(_post, (url, body))


def _post(url: str, body: bytes) -> tuple[int, float, str]:
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", content=body, timeout=120,
                   headers={"Content-Type": "application/json"})
    return r.status_code, time.perf_counter() - start, r.json()["error"]["message"][:160]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hybridkv-bench-output/health-oversized")
    parser.add_argument("--preset", default="gemma3-tiny")
    parser.add_argument("--mb", type=float, default=7.0)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args.preset, port, out / "server.log", ["--threads", "1"])
    text = ("lorem ipsum " * int(args.mb * 1e6 / 12 + 1))[:int(args.mb * 1e6)]
    body = json.dumps({"model": args.preset, "prompt": text, "max_tokens": 4}).encode()
    poller = Poller(url)
    poller.start()
    refusals = []
    try:
        for _ in range(args.repeats):
            poller.bucket = "idle"
            time.sleep(1.0)
            poller.bucket = "loaded"
            refusals.append(refuse_once(url, body))
        poller.bucket = "idle"
        time.sleep(1.0)
    finally:
        poller.stopped.set()
        poller.join(5)
        server.terminate()
        server.wait(60)
    result = {"preset": args.preset, "body_bytes": len(body), "repeats": args.repeats,
              "load_average": os.getloadavg(),
              "health_idle": percentiles(poller.buckets["idle"]),
              "health_while_refusing": percentiles(poller.buckets["loaded"]),
              "refusal_status": sorted({s for s, _, _ in refusals}),
              "refusal_seconds": [round(t, 3) for _, t, _ in refusals],
              "refusal_message": refusals[0][2]}
    (out / "health_oversized.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
