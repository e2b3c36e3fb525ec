"""The watcher's listening sockets: aiohttp's request handler behind the guards it lacks, and its logs kept to one
structured line per event.

- **Header deadline**: a request's headers must be complete within `header_timeout` seconds of the connection opening
  or of the first byte after the last response; a client that trickles them (slowloris) gets 408 and is closed.
- **Half-close**: a client that sends its request and then shuts down its sending side is still answered. A FIN alone
  cannot tell that client from one that went away, so the connection writes a `100 Continue` interim response twice
  (RFC 9110 15.2: an HTTP/1.1 client must accept unexpected 1xx responses): a client that is gone answers the first
  with a reset, the second write fails, and the request is cancelled as for any disconnect.
- **Bodies as sent**: request bodies are not decoded (aiohttp's auto_decompress off): what the handler reads is what
  the client's Content-Length or chunked framing delimits, so the proxy forwards it under the same framing.
- **Logs**: aiohttp's and asyncio's log records become one JSON event each, with the exception's type and never its
  text: aiohttp's parse errors quote the offending header bytes (`no header value is ever logged`).

`serve(app, host, port, ...)` starts an application behind these connections and returns its `Listener`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import HttpVersion11, web

if TYPE_CHECKING:
    from kvops.watch.watcher import EventLog

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
LINGER_SECONDS = 2.0
PROBE_GAP_SECONDS = 0.5  # between the two interim responses: far longer than a round trip to a peer that is gone


class ClientConnection(asyncio.Protocol):
    """One client's TCP connection, in front of the aiohttp handler that parses and answers its requests."""

    def __init__(self, handler: asyncio.Protocol, header_timeout: float, log: EventLog):
        self.handler = handler
        self.header_timeout = header_timeout
        self.log = log
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a request is being answered (its handler runs, or its response is being written)
        self.idle = True  # no byte received since the last response ended
        self.responding = False  # the current response's status line has been written
        self.http11 = False
        self.eof = False
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol, delegated to aiohttp's handler ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.handler.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self.idle = False
        if not self.busy and self._timer is None:
            self._arm()
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self.idle:
            return self.handler.eof_received()  # nothing asked: close, as aiohttp does
        self.eof = True
        self.handler.close()  # type: ignore[attr-defined]  # answer what was asked, then close
        self._probe()
        return True  # keep our sending side open for the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    # --- what the application tells it ------------------------------------------------------------------------

    def request_started(self, http11: bool) -> None:
        self.busy, self.responding, self.http11 = True, False, http11
        self._disarm()
        if self.eof:
            self._probe()

    def response_started(self) -> None:
        self.responding = True

    def request_finished(self) -> None:
        self.busy, self.idle = False, True

    # --- the guards ---------------------------------------------------------------------------------------------

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.header_timeout, self._headers_overdue)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_overdue(self) -> None:
        self._timer = None
        if self.busy or self.transport is None or self.transport.is_closing():
            return
        self.log.emit("request_timeout", reason=f"no complete request headers within {self.header_timeout:g} s")
        self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()

    def _probe(self, again: bool = True) -> None:
        """After the client's FIN: an interim response, twice; a client that is gone makes the second one fail."""
        if not (self.busy and self.http11) or self.responding or self.transport is None or self.transport.is_closing():
            return
        self.transport.write(CONTINUE)
        if again:
            asyncio.get_running_loop().call_later(PROBE_GAP_SECONDS, self._probe, False)


def connection_of(request: web.BaseRequest) -> ClientConnection | None:
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, ClientConnection) else None


@web.middleware
async def track_requests(request: web.Request, handler: Any) -> web.StreamResponse:
    """Tell the connection when a request starts and when its response has been written (here, not after the
    handler returns, so that a half-closed client's answer is out before the connection counts as idle)."""
    connection = connection_of(request)
    if connection is None:
        return await handler(request)
    connection.request_started(request.version >= HttpVersion11)
    try:
        try:
            response = await handler(request)
        except web.HTTPException as answer:  # 404, 405 of the router: aiohttp would write them after us
            await _write(request, answer)
            raise
        await _write(request, response)
        return response
    finally:
        connection.request_finished()


async def _write(request: web.Request, response: web.StreamResponse) -> None:
    if not response.prepared:
        await response.prepare(request)
        await response.write_eof()


async def _response_started(request: web.Request, response: web.StreamResponse) -> None:
    connection = connection_of(request)
    if connection is not None:
        connection.response_started()


class Listener:
    """An application served on one address through ClientConnections (aiohttp's TCPSite, its protocol wrapped)."""

    def __init__(self, runner: web.AppRunner, server: asyncio.Server):
        self.runner, self.server = runner, server

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        """Listen and accept (a listener made with start_serving=False has its address bound, refusing connections)."""
        await self.server.start_serving()

    async def close(self) -> None:
        self.server.close()
        await self.runner.cleanup()


async def serve(
    app: web.Application, host: str, port: int, *, header_timeout: float, log: EventLog, start_serving: bool = True
) -> Listener:
    """Start serving `app` (a client that disconnects cancels its handler: what a proxy needs to cancel upstream
    work); OSError when the address cannot be bound. With start_serving=False the address is bound but not listened
    on until `Listener.start()`."""
    app.middlewares.insert(0, track_requests)
    app.on_response_prepare.append(_response_started)
    # lingering: how long an answered request's unread body is drained before the close (aiohttp's 10 s would
    # keep a stalled client's connection that long after its 408). auto_decompress off: the proxy reads a body as
    # the client framed it (aiohttp would inflate a gzip body under its compressed Content-Length, and the proxy
    # forward the inflated bytes under that length: the rest parsed upstream as a request of its own)
    runner = web.AppRunner(
        app, access_log=None, handler_cancellation=True, lingering_time=LINGER_SECONDS, auto_decompress=False
    )
    await runner.setup()
    handlers = runner.server
    assert handlers is not None
    try:
        server = await asyncio.get_running_loop().create_server(
            lambda: ClientConnection(handlers(), header_timeout, log),
            host,
            port,
            reuse_address=True,
            start_serving=start_serving,
        )
    except OSError:
        await runner.cleanup()
        raise
    return Listener(runner, server)


class EventLogHandler(logging.Handler):
    """aiohttp's and asyncio's log records as one event line each: the logger, the message template's gist, and
    the exception's type; never the exception's text nor the record's arguments."""

    def __init__(self, log: EventLog):
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            error = record.exc_info[1] if record.exc_info else None
            self.log.emit(
                "server_error",
                logger=record.name,
                message=str(record.msg).split("%", 1)[0].strip()[:120],
                error=type(error).__name__ if error is not None else None,
            )
        except Exception:  # a log line must never take the server down
            self.handleError(record)


def capture_library_logs(log: EventLog) -> None:
    """Route aiohttp's and asyncio's warnings and errors through the event log instead of stderr tracebacks."""
    handler = EventLogHandler(log)
    for name in ("aiohttp", "asyncio"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
