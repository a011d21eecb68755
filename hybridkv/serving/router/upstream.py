"""The router's HTTP/1.1 client to its backends, on asyncio streams.

One request is written as one buffer (head and body); the reply's head is
parsed once, and its body comes back as the bytes the backend sent, with
the chunked framing taken off (`Reply.chunks`), never decoded or re-encoded.
Connections are kept alive, per backend origin, for the next request.

    pool = UpstreamPool(read_timeout=600.0)
    reply = await pool.request("POST", "http://127.0.0.1:8001/v1/completions",
                               [("content-type", "application/json")], b'{"prompt": [1]}')
    async for piece in reply.chunks():   # b'data: {...}\\n\\n', ...
        ...
    # the connection went back to the pool when the body ended

A connection goes back to the pool only when its reply was read to the end
and neither side asked to close it; a reply dropped half-read (`Reply.close`)
closes its connection. A pooled connection the backend has since closed is
not used; one that fails before the first byte of its reply (the backend
closed it as the request left) is replaced by a new connection, once.
`UpstreamError` names what went wrong: no connection within
`connect_timeout`, no byte within `read_timeout`, a connection closed before
the reply ended, or a reply that is not HTTP/1.x.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import NamedTuple
from urllib.parse import urlsplit

CHUNK_LIMIT = 64 * 1024  # bytes read at a time from a content-length body
WRITE_HIGH_WATER = 64 * 1024  # wait for the socket past this much unsent data
NO_BODY_STATUSES = (204, 304)


class UpstreamError(Exception):
    """The backend could not be reached, or broke off or garbled its reply."""


class Origin(NamedTuple):
    scheme: str
    host: str
    port: int


def split_url(url: str) -> tuple[Origin, str]:
    """`http://h:8001/v1/x?y=1` -> (Origin('http', 'h', 8001), '/v1/x?y=1');
    ValueError for another scheme."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin(parts.scheme, parts.hostname, port), target


class Connection:
    """One open connection to an origin, with an idle timer that aborts it when
    no read completes for `seconds` (one timer per exchange, not one per read:
    a read only notes the time)."""

    __slots__ = ("origin", "reader", "writer", "timer", "seconds", "last_read", "timed_out")

    def __init__(self, origin: Origin, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.origin = origin
        self.reader = reader
        self.writer = writer
        self.timer: asyncio.TimerHandle | None = None
        self.seconds = 0.0
        self.last_read = 0.0
        self.timed_out = False

    def is_reusable(self) -> bool:
        """Still open and silent (a closed one has its EOF waiting)."""
        return not self.writer.is_closing() and not self.reader.at_eof()

    def arm(self, seconds: float) -> None:
        """Start the idle timer: abort unless some read completes every `seconds`."""
        loop = asyncio.get_running_loop()
        self.seconds, self.last_read = seconds, loop.time()
        self.disarm()
        self.timer = loop.call_later(seconds, self._expire)

    def touch(self) -> None:
        """A read completed: the idle timer counts from now."""
        self.last_read = asyncio.get_running_loop().time()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        idle = loop.time() - self.last_read
        if idle < self.seconds:
            self.timer = loop.call_later(self.seconds - idle, self._expire)
            return
        self.timed_out = True
        self.abort()

    def abort(self) -> None:
        self.disarm()
        self.writer.transport.abort()


class Head(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]  # names lowercased, in the order received
    keep_alive: bool


def parse_head(raw: bytes) -> Head:
    """The status line and headers of a reply (`raw` ends with the blank line);
    UpstreamError if it is not HTTP/1.x."""
    lines = raw.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or not code.isdigit():
        raise UpstreamError(f"not an HTTP/1.x reply: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(b":")
            if not sep:
                raise UpstreamError(f"a header line without a colon: {line[:80]!r}")
            headers.append((name.strip().lower(), value.strip()))
    close = any(n == b"connection" and b"close" in v.lower() for n, v in headers)
    return Head(int(code), headers, version == b"HTTP/1.1" and not close)


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header `name` (lowercase), or None."""
    return next((v for n, v in headers if n == name), None)


def encode_request(method: str, target: str, origin: Origin,
                   headers: list[tuple[str, str]], body: bytes) -> bytes:
    """One buffer: request line, `host`, `headers`, `content-length`, body."""
    lines = [f"{method} {target} HTTP/1.1", f"host: {origin.host}:{origin.port}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines += [f"content-length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


class Reply:
    """A backend's reply: `status`, `headers` (lowercased names, as received), and
    its body through `chunks()` or `read()`, each to be called once."""

    __slots__ = ("pool", "conn", "status", "headers", "keep_alive", "length", "chunked",
                 "finished")

    def __init__(self, pool: UpstreamPool, conn: Connection, head: Head, method: str) -> None:
        self.pool, self.conn = pool, conn
        self.status, self.headers = head.status, head.headers
        self.chunked = b"chunked" in (header(head.headers, b"transfer-encoding") or b"")
        length = header(head.headers, b"content-length")
        # None: the body runs to the end of the connection
        self.length = None if self.chunked or length is None else _length(length)
        if method == "HEAD" or head.status in NO_BODY_STATUSES or head.status < 200:
            self.chunked, self.length = False, 0
        self.keep_alive = head.keep_alive and (self.chunked or self.length is not None)
        self.finished = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunk framing removed); UpstreamError if the
        connection breaks or times out first. The connection is released at the end."""
        try:
            if self.chunked:
                async for piece in self._chunked():
                    yield piece
            else:
                async for piece in self._plain():
                    yield piece
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as err:
            self.close()
            raise UpstreamError(self.pool.why(self.conn, err)) from None
        self.finished = True
        self.pool.release(self.conn, self.keep_alive)

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([piece async for piece in self.chunks()])

    def close(self) -> None:
        """Drop the reply; a body not read to its end closes the connection."""
        if not self.finished:
            self.finished = True
            self.conn.abort()

    async def _chunked(self) -> AsyncIterator[bytes]:
        reader, conn = self.conn.reader, self.conn
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailer fields: not relayed
                return
            data = await reader.readexactly(size + 2)
            conn.touch()
            if data[-2:] != b"\r\n":
                raise ValueError("a chunk does not end with CRLF")
            yield data[:-2]

    async def _plain(self) -> AsyncIterator[bytes]:
        reader, conn, left = self.conn.reader, self.conn, self.length
        while left is None or left > 0:
            data = await reader.read(CHUNK_LIMIT if left is None else min(left, CHUNK_LIMIT))
            if not data:
                if left is None:
                    return
                raise asyncio.IncompleteReadError(b"", left)
            conn.touch()
            if left is not None:
                left -= len(data)
            yield data


def _length(value: bytes) -> int:
    if not value.strip().isdigit():
        raise UpstreamError(f"a content-length that is not a number: {value[:40]!r}")
    return int(value)


class _Stale(Exception):
    """A pooled connection closed by the backend before any byte of the reply."""


class UpstreamPool:
    """Kept-alive connections per origin and the requests sent on them."""

    def __init__(self, read_timeout: float = 600.0, connect_timeout: float = 2.0,
                 max_idle: int = 1000) -> None:
        if read_timeout <= 0 or connect_timeout <= 0:
            raise ValueError(f"timeouts must be positive, got read_timeout={read_timeout}, "
                             f"connect_timeout={connect_timeout}")
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.idle: dict[Origin, list[Connection]] = {}
        self.tls: ssl.SSLContext | None = None

    async def request(self, method: str, url: str, headers: list[tuple[str, str]],
                      body: bytes = b"", read_timeout: float | None = None) -> Reply:
        """Send the request and read the reply's head; UpstreamError if that fails.
        `read_timeout` (default: the pool's) bounds every wait for a byte."""
        origin, target = split_url(url)
        data = encode_request(method, target, origin, headers, body)
        seconds = read_timeout or self.read_timeout
        conn = self._pooled(origin)
        if conn is not None:
            try:
                head = await self._exchange(conn, data, seconds, stale_ok=True)
                return Reply(self, conn, head, method)
            except _Stale:
                pass  # the backend closed it as the request left: once more, anew
        conn = await self._connect(origin)
        head = await self._exchange(conn, data, seconds, stale_ok=False)
        return Reply(self, conn, head, method)

    def release(self, conn: Connection, keep_alive: bool) -> None:
        """Back to the pool after a complete reply, or closed."""
        conn.disarm()
        idle = self.idle.setdefault(conn.origin, [])
        if keep_alive and conn.is_reusable() and len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.writer.close()

    async def close(self) -> None:
        """Close every idle connection."""
        for idle in self.idle.values():
            for conn in idle:
                conn.writer.close()
        self.idle.clear()

    def why(self, conn: Connection, err: BaseException) -> str:
        """What `err`, raised reading from `conn`, means, in words."""
        where = f"{conn.origin.host}:{conn.origin.port}"
        if conn.timed_out:
            return f"{where} sent nothing for {conn.seconds:g} s"
        if isinstance(err, asyncio.IncompleteReadError):
            return f"{where} closed the connection before the reply ended"
        if isinstance(err, asyncio.LimitOverrunError):
            return f"{where} sent a line longer than the reader's limit"
        return f"{where}: {type(err).__name__}: {err}"

    def _pooled(self, origin: Origin) -> Connection | None:
        idle = self.idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.is_reusable():
                return conn
            conn.writer.close()
        return None

    async def _connect(self, origin: Origin) -> Connection:
        if origin.scheme == "https" and self.tls is None:
            self.tls = ssl.create_default_context()
        tls = self.tls if origin.scheme == "https" else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(origin.host, origin.port, ssl=tls),
                self.connect_timeout)
        except (TimeoutError, asyncio.TimeoutError):
            raise UpstreamError(f"no connection to {origin.host}:{origin.port} within "
                                f"{self.connect_timeout:g} s") from None
        except OSError as err:
            raise UpstreamError(f"cannot connect to {origin.host}:{origin.port}: "
                                f"{err.strerror or err}") from None
        return Connection(origin, reader, writer)

    async def _exchange(self, conn: Connection, data: bytes, seconds: float,
                        stale_ok: bool) -> Head:
        """Write the request, read the reply's head. _Stale (when `stale_ok`) if the
        connection closes before a byte arrives; UpstreamError for other failures."""
        try:
            conn.writer.write(data)
            if conn.writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                await conn.writer.drain()
            conn.arm(seconds)
            while True:
                head = parse_head(await conn.reader.readuntil(b"\r\n\r\n"))
                conn.touch()
                if head.status >= 200 or head.status == 101:
                    return head  # (an interim 1xx, such as 100 Continue, is skipped)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
            conn.abort()
            if stale_ok and not conn.timed_out and _nothing_read(err):
                raise _Stale() from None
            raise UpstreamError(self.why(conn, err)) from None
        except BaseException:  # a garbled head, or the request cancelled
            conn.abort()
            raise


def _nothing_read(err: BaseException) -> bool:
    return not isinstance(err, asyncio.IncompleteReadError) or not err.partial
