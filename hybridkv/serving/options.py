"""Command-line options of `hybridkv serve` (no heavy imports: the CLI builds
its parser before knowing which command runs).

vLLM's names for the common flags work as they do in `vllm serve`
(`--max-model-len`, `--enable-prefix-caching` / `--no-enable-prefix-caching`,
`--block-size`, `--max-num-seqs`, `--max-num-batched-tokens`,
`--served-model-name`, `--seed`, `--api-key`, `--host`, `--port`).
"""

from __future__ import annotations

import argparse

DEFAULT_MAX_QUEUE = 256
DEFAULT_MAX_BODY_BYTES = 8 << 20
DEFAULT_DRAIN_SECONDS = 60.0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the serve options to `parser` (MODEL plus server and engine options)."""
    parser.add_argument("model", help="a preset name (hybridkv.models.list_presets()) or a "
                                      "local checkpoint directory")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1/* and /tokenize")
    server.add_argument("--served-model-name", default=None,
                        help="the model id clients send (default: MODEL)")
    server.add_argument("--events", default=None, metavar="URL",
                        help="publish block events to this Redis (redis://host:port/db)")
    server.add_argument("--instance-id", default=None,
                        help="names this instance in --events (default: host:port)")
    server.add_argument("--kv-events-config", default=None, metavar="JSON",
                        help="also publish block events as vLLM does (ZMQ), vLLM's JSON: "
                             "'{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
                             "\"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": "
                             "\"tcp://*:5558\"}'")
    server.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                        help="sequences that may wait beyond --max-num-seqs before new "
                             "requests get 429")
    server.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies get 413")
    server.add_argument("--max-prompt-chars", type=int, default=None,
                        help="text prompts (or chat messages) with more characters get 400 "
                             "before tokenizing (default: 32 per context token, at least "
                             "65536)")
    server.add_argument("--access-log", action="store_true",
                        help="log one line per request: client, method, path, status, "
                             "latency")
    server.add_argument("--drain-timeout", type=float, default=DEFAULT_DRAIN_SECONDS,
                        help="seconds SIGTERM waits for in-flight requests")
    server.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    engine = parser.add_argument_group("engine")
    engine.add_argument("--kv-cache-bytes", default=None,
                        help="KV cache budget, e.g. 64MiB (default 64MiB)")
    engine.add_argument("--num-blocks", type=int, default=None,
                        help="pool size in blocks (overrides --kv-cache-bytes)")
    engine.add_argument("--kv-store", default=None, metavar="URL",
                        help="a second KV tier behind the device pool: cpu://?size=4GiB, "
                             "file:///dir?size=20GiB or redis://host:port/db (docs/kv_tiers.md)")
    engine.add_argument("--block-size", type=int, default=16)
    engine.add_argument("--max-num-seqs", type=int, default=32)
    engine.add_argument("--max-num-batched-tokens", type=int, default=2048)
    engine.add_argument("--hash-algo", default="sha256", choices=["sha256", "xxhash"])
    engine.add_argument("--eviction-policy", default="hybrid")
    engine.add_argument("--enable-prefix-caching", dest="enable_prefix_caching",
                        action=argparse.BooleanOptionalAction, default=True,
                        help="automatic prefix caching (on by default)")
    engine.add_argument("--no-prefix-caching", dest="enable_prefix_caching",
                        action="store_false", help="the same as --no-enable-prefix-caching")
    engine.add_argument("--max-model-len", type=int, default=None,
                        help="context length in tokens (prompt + output); at most the "
                             "model's own (the default)")
    engine.add_argument("--seed", type=int, default=0,
                        help="preset weights and the default sampling seed")
    engine.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    engine.add_argument("--cpu-bind", default="none", metavar="CORES",
                        help="cores for the engine thread: none (default), auto (the first "
                             "--threads cores, when one is left for the rest of the server, "
                             "as vLLM's CPU worker binds itself) or a list such as 0,2-3")
    engine.add_argument("--engine-process", action=argparse.BooleanOptionalAction,
                        default=True, help="run the engine in a process of its own (the "
                                           "default), so the HTTP side's work for each "
                                           "streamed token does not slow its steps")
    engine.add_argument("--prepack-weights", action=argparse.BooleanOptionalAction,
                        default=True, help="CPU: a oneDNN-packed copy of the linear weights "
                                           "(faster steps; twice their memory)")
