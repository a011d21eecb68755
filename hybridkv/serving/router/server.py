"""`hybridkv route --backend URL ...`: the options and uvicorn."""

from __future__ import annotations

import argparse
import gc
import logging

from hybridkv.serving.router.policy import DEFAULT_BALANCE, DEFAULT_POLICY, POLICIES


def add_route_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", action="append", required=True, metavar="URL",
                   help="a `hybridkv serve` instance, or a vLLM server named in "
                        "--kv-event-source (repeat for each)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=POLICIES)
    p.add_argument("--balance", type=float, default=DEFAULT_BALANCE,
                   help="hybrid-prefix: weight of a queued prompt token against a reusable "
                        "one (0: cache only; large: least-loaded)")
    p.add_argument("--events", default=None, metavar="URL",
                   help="the Redis the backends publish block events to (redis://host:port/db)")
    p.add_argument("--kv-store", default=None, metavar="URL",
                   help="the shared Redis KV store of the backends (the URL they were "
                        "started with, redis://host:port/db): hybrid-prefix also counts the "
                        "prefixes they can load from it")
    p.add_argument("--backend-api-key", default=None, metavar="KEY",
                   help="send 'Authorization: Bearer KEY' to the backends (those started "
                        "with --api-key)")
    p.add_argument("--kv-event-source", action="append", default=[],
                   metavar="URL=tcp://HOST:PORT",
                   help="a backend's vLLM-format KV event publisher (the endpoint of vLLM's "
                        "or hybridkv's --kv-events-config); that backend's cache is learned "
                        "from these events (repeat per backend)")
    p.add_argument("--kv-event-replay-source", action="append", default=[],
                   metavar="URL=tcp://HOST:PORT",
                   help="the replay_endpoint of a --kv-event-source backend: batches missed "
                        "are asked from it")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="tokenize prompts and chat messages here with the model's tokenizer "
                        "directory (default: each backend's POST /tokenize)")
    p.add_argument("--check-interval", type=float, default=1.0,
                   help="seconds between health checks of each backend")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])


def _semantic_front(args: argparse.Namespace, state) -> object:
    """`--semantic-cache`'s fleet-wide front on the router's registry, or None."""
    from hybridkv.semantic.options import build_front

    return build_front(args, "", state.metrics.registry)


def _freeze_startup_objects() -> None:
    """Startup leaves ~400k long-lived objects (torch and transformers are imported,
    the tokenizer loaded): moved out of the collector's sight, so that no full
    collection while routing walks them (about 0.85 s each on this 2-core machine
    under load: a stall of every request in flight)."""
    gc.collect()
    gc.freeze()


def run_router(args: argparse.Namespace) -> int:
    """Serve until SIGTERM / SIGINT. ValueError for bad options."""
    from hybridkv.serving.router.policy import check_balance

    check_balance(args.balance)
    if args.events is not None and not args.events.startswith(("redis://", "rediss://",
                                                                "unix://")):
        raise ValueError(f"--events {args.events!r} is not a Redis URL (redis://host:port/db)")
    if args.kv_store is not None:
        from hybridkv.store.url import parse_store_url

        if parse_store_url(args.kv_store).scheme != "redis":
            raise ValueError(f"--kv-store {args.kv_store!r} is not a redis:// URL (only a "
                             f"shared Redis store is visible to the router)")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    for url in args.backend:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--backend {url!r} is not an http(s) URL")
    from hybridkv.serving.router.zmq_source import event_sources

    sources = event_sources(args.kv_event_source, args.kv_event_replay_source)
    backends = {url.rstrip("/") for url in args.backend}
    for source in sources:
        if source.backend_url not in backends:
            raise ValueError(f"--kv-event-source names {source.backend_url!r}, which is not "
                             f"a --backend")
    import uvicorn

    from hybridkv.serving.router.app import RouterApp
    from hybridkv.serving.router.endpoints import build_app
    from hybridkv.serving.router.routing import Router

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state = RouterApp(Router(args.policy, args.balance), args.backend, args.events,
                      check_interval=args.check_interval, kv_store_url=args.kv_store,
                      backend_api_key=args.backend_api_key,
                      kv_event_sources=sources, tokenizer_dir=args.tokenizer)
    state.semantic = _semantic_front(args, state)
    _freeze_startup_objects()
    # no access log and no X-Forwarded-* rewriting: neither is read, both cost per request
    uvicorn.run(build_app(state), host=args.host, port=args.port, log_level=args.log_level,
                access_log=False, proxy_headers=False)
    return 0
