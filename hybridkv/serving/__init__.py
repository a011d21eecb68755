"""Serving on top of the engine: `hybridkv serve`, an OpenAI-compatible HTTP server, and
`hybridkv route` (the `router` subpackage), which spreads requests over servers.

The server:
app (routes, auth, body limits), protocol (request/response models),
completions (requests to engine sequences, SSE), async_engine (the engine
thread and its asyncio front), prompts (tokenization and limits), detokenizer,
metrics (Prometheus), event_publisher (block events to Redis), layout (the KV
cache layout routers read), errors (OpenAI error bodies), options and server
(the command). Nothing heavy is imported here.
"""
