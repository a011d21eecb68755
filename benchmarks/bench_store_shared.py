"""Two instances on one Redis: how much of a document the second loads, and what
the first pays for writing at compute time.

Reuse (per model): instance A (pool of about one document) serves
`--num-docs` documents of `--doc-tokens` tokens one after the other, so it
still holds the last and has evicted the others; then instance B (its own
pool, same Redis) asks for each document again, exactly and with a new
question after it. Reported per document: whether A still held it, the
tokens B loaded from the store, that as a fraction of the document's
reusable tokens (what a hit can cover: the document's blocks, less the one
token a request must compute) and of what A's own repeat reuses. Both with
shared-store writes (the default for redis://) and without (`?shared=0`:
blocks written only when evicted).

Throughput (per model): one instance serves `--requests` distinct documents
with a question (`--output-tokens` each) in one batch, timed from submit to
the last token plus `flush_kv_store()` (every write done), with shared
writes and without, alternating, `--repeats` times after a warm-up; each run
gets a fresh engine and an emptied Redis (so every run writes everything).
Reported: median tokens/s (prompt + output), min-max, the ratio of medians,
the same per CPU second of this process (the engine and its writer thread:
less disturbed by other work on the machine), the share of the engine
thread's CPU time spent in the tier's step hooks (where shared writes pick
and copy blocks) and the writer thread's CPU time, and the load average
before and after.

    python benchmarks/bench_store_shared.py --out /tmp/shared-bench
    python benchmarks/bench_store_shared.py --out /tmp/shared-bench --quick

Writes DIR/store_shared.json (`--out DIR`). Redis: a redis-server started on
a free loopback port for the run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import warnings

from common import add_common_args, prepare_out, write_result
from store_ceilings import start_redis

from hybridkv import LLM, SamplingParams
from hybridkv.kv_cache.request import Request

MODELS = ("gemma3-tiny", "jamba-tiny")
BLOCK = 16


def documents(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(length)] for _ in range(n)]


def pool_for_one(name: str, tokens: int) -> int:
    """Blocks of a pool that holds about one request of `tokens` tokens."""
    probe = LLM(name, block_size=BLOCK, num_blocks=4)
    need = next(n for n in range(4, 100_000)
                if probe.kv.coordinator.max_blocks_held(tokens, 2048) <= n - 1)
    return need * 5 // 4


def reuse(name: str, url: str, args, client) -> dict:
    """The reuse experiment for one store URL (Redis emptied first)."""
    client.flushall()
    docs = documents(args.num_docs, args.doc_tokens, seed=1)
    one = SamplingParams(max_tokens=4, ignore_eos=True)
    num_blocks = pool_for_one(name, args.doc_tokens + 16)
    a = LLM(name, block_size=BLOCK, num_blocks=num_blocks, kv_store=url)
    for doc in docs:
        a.generate([doc], one)
    a.flush_kv_store()
    held = [a.kv.get_computed_blocks(Request(f"probe{i}", d))[1] for i, d in enumerate(docs)]
    # B asks for each document exactly, C with a new question after it (separate
    # instances: B's own pool would otherwise serve C's requests)
    b = LLM(name, block_size=BLOCK, num_blocks=num_blocks, kv_store=url)
    c = LLM(name, block_size=BLOCK, num_blocks=num_blocks, kv_store=url)
    rng = random.Random(2)
    align = b.kv.coordinator.alignment
    rows = []
    for i, doc in enumerate(docs):
        exact = b.generate([doc], one)[0].num_external_cached_tokens
        asked = doc + [rng.randrange(3, 500) for _ in range(8)]
        with_question = c.generate([asked], one)[0].num_external_cached_tokens
        rows.append({"doc": i, "held_by_first": held[i] > 0, "first_pool_hit": held[i],
                     "loaded_exact": exact, "loaded_with_question": with_question,
                     "reusable_exact": (len(doc) - 1) // align * align,
                     "reusable_with_question": len(doc) // align * align})
    # A's own repeat (its pool and the store) of every document, for comparison
    own = [a.generate([doc], one)[0].num_cached_tokens for doc in docs]
    for row, tokens in zip(rows, own):
        row["first_own_repeat"] = tokens
    stats = a.kv_store_stats()
    for llm in (a, b, c):
        llm.close()
    return {"url": url, "num_blocks": num_blocks, "docs": rows,
            "first_written_blocks": stats.written_blocks,
            "first_skipped_blocks": stats.skipped_blocks,
            "first_dropped_blocks": stats.dropped_blocks}


def timed(fn, totals: list[float]):
    """`fn` adding its engine-thread CPU seconds to totals[0]."""
    def wrapper(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[0] += time.thread_time() - t0
    return wrapper


def one_run(name: str, url: str, prompts, params, client) -> dict:
    """One batch on a fresh engine and an empty Redis: wall and CPU seconds,
    tokens, and the CPU seconds of the tier's step hooks on the engine's
    thread (`hook_cpu_s`: before_step, after_step, extend_hit) and of its
    writer thread (`writer_cpu_s`)."""
    client.flushall()
    llm = LLM(name, block_size=BLOCK, kv_store=url)
    llm.generate([prompts[0][:32]], SamplingParams(max_tokens=1))  # first step warm
    llm.flush_kv_store()
    client.flushall()
    tier, hooks = llm.tier, [0.0]
    assert tier is not None
    for hook in ("before_step", "after_step", "extend_hit"):
        setattr(tier, hook, timed(getattr(tier, hook), hooks))
    writer0 = tier.writer.cpu_seconds
    start, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    outs = llm.generate(prompts, params)
    thread = time.thread_time() - thread
    llm.flush_kv_store()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(len(o.prompt_token_ids) + len(o.output_token_ids) for o in outs)
    written = tier.stats().written_blocks
    llm.close()
    return {"seconds": seconds, "cpu_s": cpu, "tokens": tokens, "engine_cpu_s": thread,
            "hook_cpu_s": hooks[0], "writer_cpu_s": tier.writer.cpu_seconds - writer0,
            "written_blocks": written}


def throughput(name: str, base: str, args, client) -> dict:
    docs = documents(args.requests, args.doc_tokens, seed=3)
    rng = random.Random(4)
    prompts = [d + [rng.randrange(3, 500) for _ in range(8)] for d in docs]
    params = SamplingParams(max_tokens=args.output_tokens, ignore_eos=True)
    arms = {"shared_writes": base, "write_on_evict": base + "?shared=0"}
    runs: dict[str, list[float]] = {arm: [] for arm in arms}
    per_cpu: dict[str, list[float]] = {arm: [] for arm in arms}
    details: dict[str, list[dict]] = {arm: [] for arm in arms}
    for url in arms.values():  # warm-up, not counted
        one_run(name, url, prompts, params, client)
    load_before = os.getloadavg()
    for r in range(args.repeats):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        for arm in order:
            run = one_run(name, arms[arm], prompts, params, client)
            runs[arm].append(run["tokens"] / run["seconds"])
            per_cpu[arm].append(run["tokens"] / run["cpu_s"])
            details[arm].append(run)
    load_after = os.getloadavg()
    med = {arm: statistics.median(v) for arm, v in runs.items()}
    cpu_med = {arm: statistics.median(v) for arm, v in per_cpu.items()}
    return {"tokens_per_s": runs, "median": med,
            "spread": {arm: [min(v), max(v)] for arm, v in runs.items()},
            "ratio_of_medians": med["shared_writes"] / med["write_on_evict"],
            "tokens_per_cpu_s": per_cpu, "cpu_median": cpu_med,
            "cpu_ratio_of_medians": cpu_med["shared_writes"] / cpu_med["write_on_evict"],
            "runs": details,
            "hook_share_of_engine_cpu": {
                arm: statistics.median(r["hook_cpu_s"] / r["engine_cpu_s"] for r in rs)
                for arm, rs in details.items()},
            "writer_cpu_s": {arm: statistics.median(r["writer_cpu_s"] for r in rs)
                             for arm, rs in details.items()},
            "loadavg_before": load_before, "loadavg_after": load_after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--num-docs", type=int, default=4)
    ap.add_argument("--doc-tokens", type=int, default=384)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.quick:
        args.num_docs, args.requests, args.repeats = 2, 4, 1
    prepare_out(args.out)
    warnings.simplefilter("ignore", RuntimeWarning)
    redis = start_redis()
    import redis as redis_py

    client = redis_py.Redis.from_url(redis.url)
    result: dict = {"args": vars(args), "models": {}}
    try:
        for name in args.models.split(","):
            result["models"][name] = {
                "reuse": {"shared_writes": reuse(name, redis.url, args, client),
                          "write_on_evict": reuse(name, redis.url + "?shared=0", args, client)},
                "throughput": throughput(name, redis.url, args, client)}
            report(name, result["models"][name])
    finally:
        client.close()
        redis.stop()
    print(write_result("store_shared", result, args.out))


def report(name: str, res: dict) -> None:
    for arm, r in res["reuse"].items():
        for row in r["docs"]:
            print(f"{name} {arm:15s} doc {row['doc']} held={row['held_by_first']!s:5s} "
                  f"loaded exact {row['loaded_exact']}/{row['reusable_exact']} "
                  f"(A's own {row['first_own_repeat']}), with question "
                  f"{row['loaded_with_question']}/{row['reusable_with_question']}")
    t = res["throughput"]
    print(f"{name} throughput tok/s median {t['median']} spread {t['spread']} "
          f"ratio {t['ratio_of_medians']:.3f}; per CPU s median {t['cpu_median']} ratio "
          f"{t['cpu_ratio_of_medians']:.3f}; tier hooks' share of the engine thread's CPU "
          f"{t['hook_share_of_engine_cpu']}, writer CPU s {t['writer_cpu_s']}; load "
          f"{t['loadavg_before']} -> {t['loadavg_after']}")


if __name__ == "__main__":
    main()
