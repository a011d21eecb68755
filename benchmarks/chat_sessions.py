"""A multi-turn chat workload over `/v1/chat/completions`, streamed, for either server.

`num_sessions` conversations run at once, each `num_turns` turns: a turn sends the
whole conversation so far (a shared system message, earlier user messages and the
server's replies) plus a new user message, greedy with `ignore_eos` and
`max_tokens` output tokens. The same seed gives the same user messages to both
servers. Reports what `vllm bench serve` reports: requests/s, TTFT mean / p50 /
p99 and TPOT (ms), completed and failed requests.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
import urllib.request

WORDS = ("cache block window prefix token layer model state hybrid memory request "
         "server attention sliding global decode prefill reuse hash pool").split()


def _text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def _stream_chat(url: str, model: str, messages: list[dict], max_tokens: int
                 ) -> tuple[str, float, float, int]:
    """(reply, ttft s, total s, output chunks) of one streamed chat completion."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    start = time.perf_counter()
    ttft, parts = None, []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            choices = json.loads(line[5:]).get("choices") or [{}]
            piece = choices[0].get("delta", {}).get("content")
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - start
                parts.append(piece)
    total = time.perf_counter() - start
    return "".join(parts), ttft if ttft is not None else total, total, len(parts)


def run_chat(url: str, model: str, *, num_sessions: int = 8, num_turns: int = 4,
             system_words: int = 300, user_words: int = 40, max_tokens: int = 32,
             seed: int = 0) -> dict:
    """Play the workload against the server at `url`; the metrics dict."""
    rng = random.Random(seed)
    system = _text(rng, system_words)
    users = [[_text(rng, user_words) for _ in range(num_turns)] for _ in range(num_sessions)]
    records: list[tuple[float, float, int]] = []
    failed = [0]
    lock = threading.Lock()

    def session(s: int) -> None:
        messages = [{"role": "system", "content": system}]
        for turn in range(num_turns):
            messages.append({"role": "user", "content": users[s][turn]})
            try:
                reply, ttft, total, chunks = _stream_chat(url, model, messages, max_tokens)
            except OSError:
                with lock:
                    failed[0] += 1
                return
            messages.append({"role": "assistant", "content": reply})
            with lock:
                records.append((ttft, total, chunks))

    start = time.perf_counter()
    threads = [threading.Thread(target=session, args=(s,)) for s in range(num_sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summarize(records, failed[0], time.perf_counter() - start)


def summarize(records: list[tuple[float, float, int]], failed: int, duration: float) -> dict:
    """The bench-serve style metrics of (ttft, total, output chunks) records."""
    if not records:
        return {"completed": 0, "failed": failed, "duration": duration}
    ttfts = sorted(r[0] * 1e3 for r in records)
    tpots = [(total - ttft) * 1e3 / (n - 1) for ttft, total, n in records if n > 1]
    return {"completed": len(records), "failed": failed, "duration": duration,
            "request_throughput": len(records) / duration,
            "mean_ttft_ms": statistics.fmean(ttfts), "median_ttft_ms": statistics.median(ttfts),
            "p99_ttft_ms": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "mean_tpot_ms": statistics.fmean(tpots) if tpots else 0.0}
