"""A backend that answers at once with canned bytes, for timing a router's own hop.

It serves what `hybridkv route` reads from a backend (`/health`, `/metrics`,
`/v1/kv_cache_layout`, `/v1/models`) and answers every POST to
`/v1/completions` or `/v1/chat/completions` with a streamed reply of
`--events` server-sent events (one chunk and one socket write each, as a
serving engine writes them) or, without `"stream": true`, one JSON body.
HTTP/1.1 with keep-alive, on asyncio streams; no model, no tokenizer.

    python benchmarks/canned_backend.py --port 9001 [--events 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json

MODEL = "canned"
LAYOUT = {"instance_id": "canned", "model": MODEL, "hash_algo": "sha256",
          "groups": [{"type": "full", "block_size": 16}]}


def events(n: int) -> list[bytes]:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    out = [b"data: " + json.dumps({**chunk, "choices": [{
        "index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}).encode() + b"\n\n"
        for i in range(n)]
    return out + [b"data: [DONE]\n\n"]


def reply(status: int, body: bytes, kind: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
            % (status, kind, len(body))) + body


class Canned:
    def __init__(self, num_events: int, layout: dict) -> None:
        self.stream = [b"%x\r\n%s\r\n" % (len(e), e) for e in events(num_events)]
        self.gets = {b"/health": reply(200, b""),
                     b"/metrics": reply(200, b"vllm:num_requests_running 0\n"
                                             b"vllm:num_requests_waiting 0\n", b"text/plain"),
                     b"/v1/kv_cache_layout": reply(200, json.dumps(layout).encode()),
                     b"/v1/models": reply(200, json.dumps(
                         {"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())}
        self.whole = reply(200, json.dumps({"id": "c", "object": "chat.completion", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "w0 w1"},
            "finish_reason": "length"}]}).encode())

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.split(b" ", 2)[:2]
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                await self.answer(method, path, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(self, method: bytes, path: bytes, body: bytes,
                     writer: asyncio.StreamWriter) -> None:
        if method == b"GET":
            writer.write(self.gets.get(path, reply(404, b"{}")))
            return
        if b'"stream": true' not in body and b'"stream":true' not in body:
            writer.write(self.whole)
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for piece in self.stream:
            await asyncio.sleep(0)  # one write per event, each on its own loop turn
            writer.write(piece)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def main(port: int, num_events: int, block_size: int) -> None:
    layout = {**LAYOUT, "groups": [{"type": "full", "block_size": block_size}]}
    server = await asyncio.start_server(Canned(num_events, layout).serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--events", type=int, default=6)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    asyncio.run(main(args.port, args.events, args.block_size))
