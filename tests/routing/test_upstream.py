"""The router's HTTP/1.1 client (`upstream.py`) against a real local server on
loopback whose every reply is written byte for byte by the test: what comes
back is checked against those bytes, and the connections the server
accepted show which were reused."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hybridkv.serving.router.upstream import UpstreamError, UpstreamPool, parse_head

Script = Callable[[bytes], list[bytes]]  # request bytes -> pieces to write (b"" = close)


class Server:
    """Answers each request on a connection with `script(request)`: the pieces are
    written with a short pause between them; an empty piece closes the connection;
    no pieces at all leaves the request unanswered."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(parse_head(b"HTTP/1.1 200 X\r\n" + head.split(b"\r\n", 1)[1])
                             .headers[-1][1])  # content-length is written last
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                for piece in self.script(request):
                    if not piece:
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.005)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def chunked(*pieces: bytes) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces]


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" \
               b"transfer-encoding: chunked\r\n\r\n"
EVENTS = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n"]


def test_chunked_body_comes_back_piece_by_piece_and_the_connection_is_reused():
    script = lambda _: [HEAD_CHUNKED, *chunked(*EVENTS), b"0\r\nx-trailer: 1\r\n\r\n"]  # noqa: E731

    async def main():
        async with Server(script) as server:
            pool = UpstreamPool(read_timeout=5)
            for _ in range(3):
                reply = await pool.request("POST", server.url + "/v1/completions",
                                           [("content-type", "application/json")], b'{"a": 1}')
                assert reply.status == 200
                assert (b"content-type", b"text/event-stream") in reply.headers
                assert [piece async for piece in reply.chunks()] == EVENTS
            await pool.close()
            return server

    server = run(main())
    assert server.connections == 1
    request = server.requests[0]
    assert request.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"\r\ncontent-type: application/json\r\n" in request
    assert request.endswith(b'content-length: 8\r\n\r\n{"a": 1}')


def test_an_interim_reply_is_skipped():
    script = lambda _: [b"HTTP/1.1 100 Continue\r\n\r\n",  # noqa: E731
                        b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\ndone"]

    async def main():
        async with Server(script) as server:
            reply = await UpstreamPool().request("POST", server.url + "/x", [], b"")
            assert (reply.status, await reply.read()) == (201, b"done")

    run(main())


def test_content_length_body_and_an_error_status_with_its_body():
    body = b'{"error": {"message": "max_tokens must be at least 1", "param": "max_tokens"}}'

    def script(request: bytes) -> list[bytes]:
        status = b"400 Bad Request" if b"bad" in request else b"200 OK"
        answer = body if b"bad" in request else b"x" * 200_000  # more than one read
        return [b"HTTP/1.1 %s\r\ncontent-length: %d\r\n\r\n" % (status, len(answer)), answer]

    async def main():
        async with Server(script) as server:
            pool = UpstreamPool(read_timeout=5)
            bad = await pool.request("POST", server.url + "/v1/x", [], b"bad")
            assert (bad.status, await bad.read()) == (400, body)
            good = await pool.request("POST", server.url + "/v1/x", [], b"good")
            assert (good.status, await good.read()) == (200, b"x" * 200_000)
            return server

    assert run(main()).connections == 1


@pytest.mark.parametrize("cut", ["chunked", "content-length"])
def test_backend_closing_mid_body_is_an_error_naming_it(cut):
    def script(_: bytes) -> list[bytes]:
        if cut == "chunked":
            return [HEAD_CHUNKED, *chunked(EVENTS[0]), b"40\r\npartial", b""]
        return [b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n", b"only ten b", b""]

    async def main():
        async with Server(script) as server:
            pool = UpstreamPool(read_timeout=5)
            reply = await pool.request("POST", server.url + "/x", [], b"")
            seen = []
            with pytest.raises(UpstreamError, match="closed the connection before the reply"):
                async for piece in reply.chunks():
                    seen.append(piece)
            assert seen == ([EVENTS[0]] if cut == "chunked" else [b"only ten b"])
            assert not pool.idle.get(reply.conn.origin)  # the broken one is not kept

    run(main())


@pytest.mark.parametrize("pause", [0.0, 0.05])
def test_a_connection_the_backend_closes_is_replaced(pause):
    # the server answers, then closes: the next request, sent before (pause 0: it
    # meets the close) or after the close reached the client, must not fail on it
    script = lambda _: [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b""]  # noqa: E731

    async def main():
        async with Server(script) as server:
            pool = UpstreamPool(read_timeout=5)
            for _ in range(3):
                reply = await pool.request("POST", server.url + "/x", [], b"")
                assert await reply.read() == b"ok"
                await asyncio.sleep(pause)
            return server

    assert run(main()).connections == 3


def test_connection_close_and_a_body_to_the_end_of_the_connection():
    script = lambda _: [b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", b"all of it", b""]  # noqa: E731

    async def main():
        async with Server(script) as server:
            pool = UpstreamPool(read_timeout=5)
            for _ in range(2):
                reply = await pool.request("POST", server.url + "/x", [], b"")
                assert await reply.read() == b"all of it"
            return server

    assert run(main()).connections == 2


def test_silence_times_out_and_refusal_names_the_address():
    async def main():
        async with Server(lambda _: []) as server:
            pool = UpstreamPool(read_timeout=0.2)
            with pytest.raises(UpstreamError, match=r"sent nothing for 0.2 s"):
                await pool.request("POST", server.url + "/x", [], b"")
            port = server.url.rsplit(":", 1)[1]
        with pytest.raises(UpstreamError, match=f"cannot connect to 127.0.0.1:{port}"):
            await pool.request("POST", f"http://127.0.0.1:{port}/x", [], b"")

    run(main())


def test_a_reply_that_is_not_http_and_a_bad_url():
    async def main():
        async with Server(lambda _: [b"SSH-2.0-OpenSSH\r\n\r\n"]) as server:
            with pytest.raises(UpstreamError, match="not an HTTP/1.x reply"):
                await UpstreamPool().request("POST", server.url + "/x", [], b"")
        with pytest.raises(ValueError, match="not an http"):
            await UpstreamPool().request("POST", "ftp://127.0.0.1/x", [], b"")

    run(main())
