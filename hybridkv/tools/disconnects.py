"""Many streaming clients, some of which hang up at random points.

`run_round(url, ...)` starts `num_clients` streaming completions at once
against a `hybridkv serve` process; a random quarter (by default) close their
connection after a random number of events, 0 included (while the request
may still be queued). It returns what each client saw, so a test or a
benchmark can check that every request that was not abandoned finished with
all its tokens, and then that the server holds no blocks.

    outcomes = asyncio.run(run_round("http://127.0.0.1:8000", model="gemma3-tiny",
                                     num_clients=64, max_tokens=8, seed=0))
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

import httpx


@dataclass
class Outcome:
    """What one client saw."""

    hung_up: bool  # the client closed its connection on purpose
    events: int = 0  # data events read
    tokens: int = 0  # completion tokens reported by those events
    finish_reason: str | None = None
    done: bool = False  # saw `data: [DONE]`
    status: int = 0
    error: str | None = None


async def one_client(client: httpx.AsyncClient, url: str, body: dict,
                     hang_up_after: int | None) -> Outcome:
    """Stream `body`; with `hang_up_after` N, close after N data events (0: at once)."""
    out = Outcome(hung_up=hang_up_after is not None)
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            out.status = response.status_code
            if hang_up_after == 0:
                return out
            async for line in response.aiter_lines():
                if not _read_line(out, line) or out.events == hang_up_after:
                    return out
    except httpx.HTTPError as err:
        out.error = repr(err)
    return out


def _read_line(out: Outcome, line: str) -> bool:
    """Account one SSE line; False once the stream is over."""
    if line == "data: [DONE]":
        out.done = True
        return False
    if not line.startswith("data: "):
        return True
    chunk = json.loads(line[6:])
    out.events += 1
    if "error" in chunk:
        out.error = chunk["error"]["message"]
        return False
    for choice in chunk.get("choices", []):
        out.tokens += len(choice.get("token_ids") or [])
        out.finish_reason = choice.get("finish_reason") or out.finish_reason
    return True


async def run_round(url: str, *, model: str, num_clients: int = 64, max_tokens: int = 8,
                    hang_up_share: float = 0.25, seed: int = 0,
                    timeout: float = 120.0) -> list[Outcome]:
    """One round of `num_clients` concurrent streams; a random share hangs up."""
    rng = random.Random(seed)
    hang_ups = set(rng.sample(range(num_clients), round(num_clients * hang_up_share)))
    limits = httpx.Limits(max_connections=num_clients + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        tasks = []
        for i in range(num_clients):
            prompt = [rng.randrange(1, 400) for _ in range(rng.randrange(4, 40))]
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True, "stream": True,
                    "return_token_ids": True}
            after = rng.randrange(0, max_tokens) if i in hang_ups else None
            tasks.append(one_client(client, url, body, after))
        return list(await asyncio.gather(*tasks))


def problems(outcomes: list[Outcome], max_tokens: int) -> list[str]:
    """What went wrong: a kept client without all its tokens, any error or non-200."""
    out = []
    for i, o in enumerate(outcomes):
        if o.error is not None or o.status != 200:
            out.append(f"client {i}: status {o.status}, error {o.error}")
        elif not o.hung_up and (o.tokens != max_tokens or o.finish_reason != "length"
                                or not o.done):
            out.append(f"client {i}: {o.tokens} tokens, finish {o.finish_reason}, "
                       f"done {o.done}")
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for process {pid}")
