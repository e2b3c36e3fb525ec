"""The admission proxy's HTTP/1.1 client for its one upstream: keep-alive connections, responses parsed by llhttp
(httptools), bodies streamed both ways with backpressure.

aiohttp's client spent more CPU per proxied request than aiohttp's server and all of the proxy's own work together
(bench/proxy_overhead.py: 180 us of a bare aiohttp pass-through's 208 us, against 92 us with this client). It also
sends what it is given and nothing more: no default User-Agent or Accept-Encoding, no cookie jar, the target exactly
as encoded. Errors: `Unreachable` (no connection within the connect timeout), `Broken` (anything that is not a
complete HTTP response); the caller's own exception, raised by a request body it streams, comes back unchanged.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httptools
from multidict import CIMultiDict

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline
else:  # aiohttp depends on async-timeout before 3.11
    from async_timeout import timeout as deadline

IDLE_KEEP_SECONDS = 4.0  # under uvicorn's (vLLM's) 5 s keep-alive: a pooled connection is never one it is closing
READ_AHEAD_BYTES = 1 << 18  # body bytes buffered from the upstream before it is paused


class UpstreamError(Exception):
    """The upstream did not give a usable answer; the message is one short line."""


class Unreachable(UpstreamError):
    pass


class Broken(UpstreamError):
    pass


class BodyMismatch(Broken):
    """A streamed request body that does not fill exactly the Content-Length sent ahead of it. What was sent stops
    there and the connection is closed: bytes past the length would reach the upstream as a request of their own."""


class Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._headers_ready: asyncio.Future | None = None
        self._writable: asyncio.Future | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self._wake: asyncio.Future | None = None

    # --- asyncio.Protocol ------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Broken(f"sent no valid HTTP ({type(exc).__name__})"))
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close: the upstream has finished sending

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.status and not self.complete and not self._framed():
            self.on_message_complete()  # a body delimited by the close (no Content-Length, not chunked)
        elif not self.complete:
            self._fail(Broken("closed the connection before a complete answer"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)  # the sender sees `closed` and stops

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # --- httptools callbacks ---------------------------------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self.reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response: the final one follows
            self.headers, self.reason = [], ""
            return
        self.status = status
        if self._headers_ready is not None and not self._headers_ready.done():
            self._headers_ready.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > READ_AHEAD_BYTES and self.transport is not None:
            self.transport.pause_reading()
        self._notify()

    def on_message_complete(self) -> None:
        if not self.status:
            return  # the end of an interim response
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive() and not self.closed
        self._notify()

    # --- used by Pool and Response -----------------------------------------------------------------------------------

    def _framed(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return "content-length" in names or "transfer-encoding" in names or self.status in (204, 304)

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        if self._headers_ready is not None and not self._headers_ready.done():
            self._headers_ready.set_exception(error)
        if self._wake is not None and not self._wake.done():
            self._wake.set_exception(error)

    def start(self) -> asyncio.Future:
        self._reset()
        self._headers_ready = asyncio.get_running_loop().create_future()
        return self._headers_ready

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable

    async def next_chunk(self) -> bytes:
        """The next piece of the body, b"" at its end; Broken when the connection failed mid-body."""
        while not self.chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.buffered <= READ_AHEAD_BYTES // 2 and self.transport is not None and not self.closed:
            self.transport.resume_reading()
        return chunk

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """The upstream's answer: status, reason, headers (repeated ones kept), and the body to read."""

    def __init__(self, pool: Pool, connection: Connection, head_only: bool, sender: asyncio.Task | None = None):
        self.pool, self.connection, self.sender = pool, connection, sender
        self.status, self.reason = connection.status, connection.reason
        self.headers = CIMultiDict(connection.headers)
        self.head_only = head_only  # a HEAD answer: no body follows whatever its Content-Length says
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()

    def body_nowait(self) -> bytes | None:
        """The whole body when it has all arrived already (a small answer comes with its headers), else None."""
        connection = self.connection
        if self.head_only:
            return b""
        if not connection.complete:
            return None
        body = b"".join(connection.chunks)
        connection.chunks.clear()
        return body

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iterate()])

    async def iterate(self) -> AsyncIterator[bytes]:
        if self.head_only:
            return
        while chunk := await self.connection.next_chunk():
            yield chunk

    async def next_chunk(self) -> bytes:
        return b"" if self.head_only else await self.connection.next_chunk()

    def release(self) -> None:
        """Give the connection back when its answer ended cleanly, else close it (an unread body, a HEAD answer,
        a client that went away: the upstream sees the close and stops its work)."""
        connection = self.connection
        sending = self.sender is not None and not self.sender.done()
        if self.sender is not None and sending:
            self.sender.cancel()  # the upstream answered before the request body was all sent
        if connection.complete and connection.keep_alive and not (self.head_only or connection.chunks or sending):
            self.pool.give_back(connection)
        else:
            connection.abort()


class Pool:
    """Keep-alive connections to one upstream origin."""

    def __init__(self, scheme: str, host: str, port: int, connect_timeout: float):
        self.host, self.port, self.connect_timeout = host, port, connect_timeout
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if scheme == "https" else None
        default_port = 443 if scheme == "https" else 80
        self.host_header = host if port == default_port else f"{host}:{port}"
        self.idle: list[Connection] = []

    async def _connection(self) -> Connection:
        now = time.monotonic()
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_KEEP_SECONDS:
                return connection
            connection.abort()
        loop = asyncio.get_running_loop()
        try:
            async with deadline(self.connect_timeout):
                _, connection = await loop.create_connection(
                    Connection, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None
                )
        except asyncio.TimeoutError:
            raise Unreachable(f"no connection within {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise Unreachable(f"cannot connect ({exc.strerror or type(exc).__name__})") from None
        return connection

    def give_back(self, connection: Connection) -> None:
        connection.idle_since = time.monotonic()
        self.idle.append(connection)

    async def request(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        length: int | None = None,
    ) -> Response:
        """Send one request and wait for its answer's headers. A streamed body is sent with `length` as its
        Content-Length when known (BodyMismatch when it does not come to exactly that), else chunked; an exception
        it raises is raised here."""
        connection = await self._connection()
        ready = connection.start()
        sender: asyncio.Task | None = None
        try:
            head = self._head(method, target, headers, body, length)
            if isinstance(body, bytes):
                connection.write(head + body)  # one write, one segment
            else:
                connection.write(head)
            if body is not None and not isinstance(body, bytes):
                sender = asyncio.ensure_future(self._stream(connection, body, length))
                sender.add_done_callback(_retrieve)
            await ready
        except BaseException as exc:
            connection.abort()
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: its failure is the one raised below
            ready.cancel()
            if sender is not None:
                sender.cancel()
                failure = sender.exception() if sender.done() and not sender.cancelled() else None
                if failure is not None:
                    raise failure from None  # the body's own failure (a client too slow)
            if isinstance(exc, UpstreamError | asyncio.CancelledError | asyncio.TimeoutError):
                raise
            raise Broken(f"failed while sending ({type(exc).__name__})") from None
        return Response(self, connection, head_only=method == "HEAD", sender=sender)

    def _head(self, method: str, target: str, headers: list[tuple[str, str]], body: Any, length: int | None) -> bytes:
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {self.host_header}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers]
        if isinstance(body, bytes):
            if body or method in ("POST", "PUT", "PATCH"):
                lines.append(f"Content-Length: {len(body)}\r\n")
        elif body is not None:
            lines.append(f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("utf-8", "surrogateescape")

    async def _stream(self, connection: Connection, body: AsyncIterator[bytes], length: int | None) -> None:
        chunked, left = length is None, length or 0
        try:
            async for chunk in body:
                if connection.closed:
                    raise Broken("closed the connection while the request was sent")
                if not chunk:
                    continue
                if not chunked:
                    if len(chunk) > left:
                        raise BodyMismatch(f"request body is longer than its Content-Length of {length} bytes")
                    left -= len(chunk)
                connection.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                await connection.drain()
            if chunked:
                connection.write(b"0\r\n\r\n")
            elif left:
                raise BodyMismatch(f"request body is shorter than its Content-Length of {length} bytes")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            connection._fail(exc)
            connection.abort()
            raise

    def close(self) -> None:
        for connection in self.idle:
            connection.abort()
        self.idle.clear()


def _retrieve(task: asyncio.Task) -> None:
    """A sender's failure is reported through the request it belongs to, not as an unretrieved task exception."""
    if not task.cancelled():
        task.exception()
