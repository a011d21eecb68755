"""Routing test set-ups on the shared process helper (tests/server_process.py):
backends publishing block events, routers, completions through a router."""

from __future__ import annotations

from pathlib import Path

import httpx
from server_process import ServerProcess, serve, wait_until  # noqa: F401 - re-exported


def start_backend(model: str, instance_id: str, events: str, log_dir: Path, *args: str,
            **kwargs) -> ServerProcess:
    """`hybridkv serve MODEL --instance-id ID --events URL ARGS...`."""
    return serve(model, "--instance-id", instance_id, "--events", events, *args,
                 log_dir=log_dir, **kwargs)


def route(backends: list[ServerProcess], events: str | None, log_dir: Path, policy: str,
          *args: str) -> ServerProcess:
    """`hybridkv route --policy P [--events URL] --backend URL... ARGS...`."""
    argv = ["route", "--policy", policy, "--check-interval", "0.3", *args]
    if events is not None:
        argv += ["--events", events]
    for b in backends:
        argv += ["--backend", b.url]
    return ServerProcess(argv, log_dir=log_dir)


def complete(router: ServerProcess, prompt: list[int], **kwargs) -> tuple[str, int]:
    """Send a token-id completion through `router`: (backend that served it, cached tokens)."""
    raw = router.client().completions.with_raw_response.create(
        model=kwargs.pop("model", "gemma3-tiny"), prompt=prompt,
        max_tokens=kwargs.pop("max_tokens", 1), temperature=0, **kwargs)
    body = raw.parse()
    return raw.headers["x-hybridkv-backend"], body.usage.prompt_tokens_details.cached_tokens


def wait_idle(router: ServerProcess, model: str = "gemma3-tiny") -> None:
    """Until the router sees no load anywhere: the backends' polled loads can still
    show a finished request running, and a routing claim about an idle cluster must
    not depend on that (a stale request above the average outweighs a short document)."""
    def idle() -> bool:
        reply = httpx.post(f"{router.url}/route/explain", json={"model": model, "prompt": [3]},
                           timeout=30)
        assert reply.status_code == 200, reply.text
        return all(b["in_flight"] + b["waiting"] + b["running"] + b["pending_tokens"] == 0
                   for b in reply.json()["backends"].values())
    wait_until(idle, what="idle backends")
