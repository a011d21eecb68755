"""Ceilings for KV store loads, measured in the same run: memcpy and loopback Redis.

- `memcpy_bytes_per_s(n)`: one copy of n bytes between two preallocated buffers
  (the most a load from memory can reach);
- `redis_bytes_per_s(url, sizes)`: redis-py pipelined SETs, then one MGET, of values
  of the given sizes (what `RedisStore` does, without checksums or copies into pages),
  plus `redis-benchmark` GET/SET at the largest size when the binary is there;
- `start_redis()`: a redis-server on a free loopback port, no persistence.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import time

import torch


def memcpy_bytes_per_s(num_bytes: int, repeats: int = 7) -> dict:
    """Wall-clock and CPU-time bytes/s of one copy of `num_bytes` (median of `repeats`)."""
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        dst.copy_(src)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    return {"memcpy_bytes_per_s": num_bytes / statistics.median(walls),
            "memcpy_bytes_per_cpu_s": num_bytes / max(statistics.median(cpus), 1e-9)}


def redis_bytes_per_s(url: str, sizes: list[tuple[int, int]], repeats: int = 3) -> dict:
    """GET and SET bytes/s of `count` values of `size` bytes for each (size, count)."""
    import redis

    client = redis.Redis.from_url(url)
    keys, values = [], []
    for g, (size, count) in enumerate(sizes):
        for i in range(count):
            keys.append(b"ceiling:%d:%d" % (g, i))
            values.append(os.urandom(size))
    total = sum(map(len, values))
    sets, gets = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for k, v in zip(keys, values):
            pipe.set(k, v)
        pipe.execute()
        sets.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = client.mget(keys)
        gets.append(time.perf_counter() - t0)
        assert sum(map(len, got)) == total
    client.delete(*keys)
    client.close()
    out = {"bytes": total, "redis_py_get_bytes_per_s": total / statistics.median(gets),
           "redis_py_set_bytes_per_s": total / statistics.median(sets)}
    out.update(redis_benchmark(url, max(s for s, _ in sizes)))
    return out


def redis_benchmark(url: str, size: int, requests: int = 200) -> dict:
    """`redis-benchmark -t set,get -d size -P 16` in bytes/s, if installed."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {}
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    out = subprocess.run([binary, "-h", host, "-p", port, "-t", "set,get", "-d", str(size),
                          "-n", str(requests), "-P", "16", "-q", "--csv"],
                         capture_output=True, text=True, timeout=120).stdout
    rates = {}
    for line in out.splitlines():
        parts = [p.strip('"') for p in line.split(",")]
        if parts[0] in ("SET", "GET"):
            rates[f"redis_benchmark_{parts[0].lower()}_bytes_per_s"] = float(parts[1]) * size
    return rates


class RedisProcess:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (apt-get install redis-server), "
                             "or pass --redis-url, or leave redis out of --backends")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        for _ in range(200):
            try:
                client.ping()
                return
            except redis.exceptions.RedisError:
                time.sleep(0.05)
        raise SystemExit("redis-server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def start_redis() -> RedisProcess:
    return RedisProcess()
