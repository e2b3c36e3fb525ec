"""The admission proxy: the engine's API on its own address (or on the watcher's), the level in force applied per
request.

A request is matched by its canonical path (`guard.canonical_path`: what the upstream will see, and what is
forwarded) against the engine's generation routes (`kvops.engines.get(engine).api.ROUTES`). A guarded request is
read (within `max_body_bytes` and `body_timeout`), decoded when it has a content coding (gzip, deflate; any other is
415, a corrupt one 400: never forwarded unread), parsed within depth and number limits, clamped with
`kvops.policy.clamp` on the fields its route names (max new tokens capped, n / best_of / beam width forced to 1)
or, at critical, answered 503 with Retry-After in the route's own error shape without touching the upstream; where
the level runs one sequence per request, a list of prompts counts as that many requests (`Limits.batch_refusal`).
A body the level leaves alone is forwarded byte for byte (a decoded one, decoded); everything else passes untouched,
under the framing the client gave it (the server does not decode bodies, and the upstream client refuses to send a
streamed body that does not fill its Content-Length exactly). The request's class comes from PRIORITY_HEADER only
when the client's address is in `trust_priority_from` (a gateway that sets it); from anyone else the header is
ignored and not forwarded.

Responses come back whole when the upstream sent a small body with its length, else chunk by chunk as they arrive
(server-sent events included). The upstream must send its headers within `first_byte_timeout` and then never fall
silent for `idle_timeout`; a stream that must end early ends with the route's error event and a clean terminator
(server-sent events), or is cut short (any other body: the client sees it incomplete). A client that disconnects
cancels the upstream request (the server runs with aiohttp's handler_cancellation). Requests reach the upstream
through `kvops.watch.upstream`, a keep-alive HTTP/1.1 client that sends the client's headers (hop-by-hop ones
dropped) and nothing else. Headers are never logged; the proxy's own events (upstream failures, cut streams) are
one JSON line each.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from types import ModuleType
from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from kvops.engines.api import ErrorShape, Route
from kvops.frozen import frozen
from kvops.policy import Level, Limits, Priorities, Refusal
from kvops.watch.guard import (
    PRIORITY_HEADER,
    BodyError,
    Network,
    apply_limits,
    canonical_path,
    content_codings,
    decode_body,
    encode_body,
    is_trusted,
    parse_body,
    prompt_count,
    quoted,
    request_class,
    sites,
)
from kvops.watch.upstream import BodyMismatch, Broken, Pool, Response, Unreachable
from kvops.watch.watcher import EventLog

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline
else:  # aiohttp depends on async-timeout before 3.11
    from async_timeout import timeout as deadline

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp recomputes; everything else passes both ways.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",  # the proxy answered the client's 100-continue itself when it read the body
    }
)
_HOP_BY_HOP_NAMES = tuple(sorted(_HOP_BY_HOP))
_UNTRUSTED = frozenset({PRIORITY_HEADER.lower()})  # dropped from a client the priority is not read from
_DECODED = frozenset({"content-encoding"})  # dropped from a body forwarded decoded
LEVEL_HEADER = "X-KVops-Level"
CLAMPED_HEADER = "X-KVops-Clamped"
WHOLE_BODY_BYTES = 1 << 20  # an upstream body of known length up to this size is read whole and sent in one write


@frozen
class ProxySettings:
    upstream: str  # e.g. http://127.0.0.1:8000
    engine: str = "vllm"  # whose API: the routes guarded, their fields and error shapes
    max_body_bytes: int = 8 << 20
    connect_timeout: float = 5.0
    first_byte_timeout: float = 600.0  # request sent -> response headers: a whole non-streamed generation
    idle_timeout: float = 300.0  # between two chunks of the upstream's response
    body_timeout: float = 20.0  # between two chunks of the client's request body (Apache mod_reqtimeout's 20 s)
    trust_priority_from: tuple[Network, ...] = ()  # PRIORITY_HEADER is read only from these (a gateway); default none


class ProxyMetrics:
    """Counters the proxy adds to /kvops/metrics."""

    def __init__(self, registry: CollectorRegistry):
        from prometheus_client import Counter

        self.requests = Counter(
            "kvops_proxy_requests",
            "Requests through the admission proxy, by level in force and guarded or not.",
            ["level", "guarded"],
            registry=registry,
        )
        self.clamped = Counter(
            "kvops_proxy_clamped",
            "Request fields the proxy changed, by field (max_tokens, n, best_of, beam_width).",
            ["field"],
            registry=registry,
        )
        self.rejected = Counter(
            "kvops_proxy_rejected",
            "Requests the level refused without reaching the upstream (503; sheddable ones 429).",
            registry=registry,
        )
        by_status = Counter(
            "kvops_proxy_rejected_by_status",
            "Requests the level refused, by status: 429 for the sheddable (from degrade), 503 for the others.",
            ["status"],
            registry=registry,
        )
        self.rejected_by_status = {
            status: by_status.labels(str(status.value))
            for status in (HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE)
        }
        self.refused = Counter(
            "kvops_proxy_refused",
            "Requests the proxy refused as malformed (400), too slow to send (408) or too large (413).",
            ["status"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "kvops_proxy_upstream_errors",
            "Upstream failures answered 502 (unreachable, garbage) or 504 (timed out), or that cut a stream.",
            ["status"],
            registry=registry,
        )
        # label children bound once: a labels() call per request is a lock and a dict lookup saved
        self._by_level = {
            (level, guarded): self.requests.labels(level.label, str(guarded).lower())
            for level in Level
            for guarded in (False, True)
        }

    def request(self, level: Level, guarded: bool) -> None:
        self._by_level[level, guarded].inc()


class ClientTooSlow(Exception):
    """The client's request body stalled for longer than body_timeout."""


class Unserved(Exception):
    """A request the proxy answers itself (400, 408, 413) instead of forwarding it."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class AdmissionProxy:
    def __init__(
        self,
        settings: ProxySettings,
        limits: Callable[[], Limits],
        metrics: ProxyMetrics,
        log: EventLog | None = None,
        priorities: Priorities | None = None,
    ):
        from kvops import engines

        self.settings = settings
        self.priorities = priorities or Priorities()  # the policy's request classes, for PRIORITY_HEADER
        self.limits = limits
        self.metrics = metrics
        self.log = log or EventLog(None)
        self.api: ModuleType = engines.get(settings.engine).api
        base = URL(settings.upstream)
        self.pool = Pool(base.scheme, base.raw_host or "127.0.0.1", base.port or 80, settings.connect_timeout)
        self._prefix = base.raw_path.rstrip("/")
        self._targets: dict[str, str] = {}  # canonical path -> the encoded target sent upstream

    def attach(self, app: web.Application) -> None:
        """Add the catch-all route (after the app's own routes, which keep matching first)."""
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        self.pool.close()

    # --- one request -------------------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        limits = self.limits()
        path = canonical_path(request.rel_url.raw_path)
        route: Route | None = self.api.ROUTES.match(request.method, path)
        self.metrics.request(limits.level, route is not None)
        if _transfer_coded(request.headers.get("Transfer-Encoding")):
            return self._refuse(
                HTTPStatus.NOT_IMPLEMENTED,
                "Transfer-Encoding other than chunked is not supported; send Content-Encoding instead",
                route.errors if route else self.api.ERRORS,
            )
        priority = self._priority(request)
        drop = frozenset() if priority is not None else _UNTRUSTED
        if route is None:
            return await self.forward(request, path, self._client_body(request), limits, [], self.api.ERRORS, drop)
        try:
            klass = request_class(priority, self.priorities)
        except BodyError as problem:
            return self._refuse(problem.status, str(problem), route.errors)
        refusal = limits.refusal(klass)
        if refusal is not None:  # before reading the body: under pressure the proxy spends as little as it can
            return self._reject(refusal, limits, route.errors)
        if not route.json:
            return await self.forward(request, path, self._client_body(request), limits, [], route.errors, drop)
        try:
            raw = await self._read_body(request)
            encodings = request.headers.getall("Content-Encoding", ())
            decoded = decode_body(raw, content_codings(encodings), self.settings.max_body_bytes) if encodings else raw
            body = parse_body(decoded)
            found = sites(route, body)
        except Unserved as unserved:
            return self._refuse(unserved.status, unserved.message, route.errors)
        except BodyError as problem:
            return self._refuse(problem.status, str(problem), route.errors)
        refusal = limits.batch_refusal(sum(prompt_count(site.item) for site in found), klass)
        if refusal is not None:
            return self._reject(refusal, limits, route.errors)
        changes = apply_limits(found, limits) if limits.max_tokens_cap is not None or limits.single_sequence else []
        for change in changes:
            self.metrics.clamped.labels(change.split(" ", 1)[0]).inc()
        data = encode_body(body) if changes else decoded
        if encodings:  # forwarded decoded: the coding is no longer the body's
            drop |= _DECODED
        return await self.forward(request, path, data, limits, changes, route.errors, drop)

    def _priority(self, request: web.Request) -> str | None:
        """PRIORITY_HEADER as sent by a client in `trust_priority_from` (a gateway that sets it), else None: a
        client that reaches the proxy directly cannot claim a class."""
        header = request.headers.get(PRIORITY_HEADER)
        if header is None or not is_trusted(request.remote, self.settings.trust_priority_from):
            return None
        return header

    async def _read_body(self, request: web.Request) -> bytes:
        limit, idle = self.settings.max_body_bytes, self.settings.body_timeout
        declared = request.content_length
        if declared is not None and declared > limit:
            raise Unserved(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"request body of {declared} bytes exceeds the proxy's limit of {limit} bytes",
            )
        content = request.content
        if content.is_eof():  # the whole body came with the headers: nothing to wait for
            return content.read_nowait(-1)
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                async with deadline(idle):
                    chunk = await content.readany()
            except asyncio.TimeoutError:
                raise Unserved(HTTPStatus.REQUEST_TIMEOUT, f"request body stalled for more than {idle:g} s") from None
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise Unserved(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body exceeds the proxy's limit of {limit} bytes"
                )
            chunks.append(chunk)

    def _client_body(self, request: web.Request) -> AsyncIterator[bytes] | None:
        """An unguarded request's body, streamed through (ClientTooSlow when it stalls), or None."""
        return self._stream_body(request) if request.body_exists else None

    async def _stream_body(self, request: web.Request) -> AsyncIterator[bytes]:
        idle = self.settings.body_timeout
        while True:
            try:
                async with deadline(idle):
                    chunk = await request.content.readany()
            except asyncio.TimeoutError:
                raise ClientTooSlow from None
            if not chunk:
                return
            yield chunk

    # --- answers of its own --------------------------------------------------------------------------------------

    def _reject(self, refusal: Refusal, limits: Limits, errors: ErrorShape) -> web.Response:
        """The level's refusal of this request's class: 503 (429 for the sheddable) with Retry-After."""
        self.metrics.rejected.inc()
        status = HTTPStatus(refusal.status)
        self.metrics.rejected_by_status[status].inc()
        retry = refusal.retry_after_seconds
        return self.error(status, refusal.message, limits, errors, retry_after=retry)

    def _refuse(self, status: HTTPStatus, message: str, errors: ErrorShape) -> web.Response:
        self.metrics.refused.labels(str(status.value)).inc()
        response = self.error(status, message, self.limits(), errors)
        if status in (HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.REQUEST_ENTITY_TOO_LARGE):
            response.force_close()  # the rest of the body is not worth waiting for: close, as nginx does
        return response

    def error(
        self, status: HTTPStatus, message: str, limits: Limits, errors: ErrorShape, retry_after: int | None = None
    ) -> web.Response:
        """An error in the route's own shape (vLLM's OpenAI ErrorResponse, TGI's {error, error_type}, ...)."""
        headers = {LEVEL_HEADER: limits.level.label}
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return web.json_response(errors.body(status, message), status=status.value, headers=headers)

    def _upstream_failed(self, status: HTTPStatus, message: str, path: str) -> None:
        self.metrics.upstream_errors.labels(str(status.value)).inc()
        self.log.emit("proxy_upstream_error", status=status.value, path=path, error=message)

    # --- forwarding -------------------------------------------------------------------------------------------------

    def _target(self, path: str, query: str) -> str:
        target = self._targets.get(path)
        if target is None:
            target = self._prefix + quoted(path)
            if len(self._targets) < 1024:  # the routes clients use; a scan of odd paths cannot grow it
                self._targets[path] = target
        return f"{target}?{query}" if query else target

    async def forward(
        self,
        request: web.Request,
        path: str,
        data: Any,
        limits: Limits,
        changes: list[str],
        errors: ErrorShape,
        drop: frozenset[str] = frozenset(),
    ) -> web.StreamResponse:
        """Send the request on with `data` as its body (`drop`: more header names, lowercase, not to pass on)."""
        dropped = _HOP_BY_HOP | drop | _connection_tokens(request.headers.get("Connection"))
        headers = [(name, value) for name, value in request.headers.items() if name.lower() not in dropped]
        upstream_name = self.settings.upstream
        try:
            async with deadline(self.settings.first_byte_timeout):
                upstream = await self.pool.request(
                    request.method,
                    self._target(path, request.rel_url.raw_query_string),
                    headers,
                    data,
                    None if isinstance(data, bytes) else request.content_length,
                )
        except ClientTooSlow:
            stalled = f"request body stalled for more than {self.settings.body_timeout:g} s"
            return self._refuse(HTTPStatus.REQUEST_TIMEOUT, stalled, errors)
        except BodyMismatch as exc:  # before Broken, its base: the body, not the upstream, is at fault
            refused = self._refuse(HTTPStatus.BAD_REQUEST, str(exc), errors)
            refused.force_close()
            return refused
        except Unreachable as exc:
            message = f"upstream {upstream_name} unreachable ({exc})"
            self._upstream_failed(HTTPStatus.BAD_GATEWAY, message, path)
            return self.error(HTTPStatus.BAD_GATEWAY, message, limits, errors)
        except Broken as exc:
            message = f"upstream {upstream_name} sent no valid answer ({exc})"
            self._upstream_failed(HTTPStatus.BAD_GATEWAY, message, path)
            return self.error(HTTPStatus.BAD_GATEWAY, message, limits, errors)
        except asyncio.TimeoutError:
            message = f"upstream {upstream_name} did not answer within {self.settings.first_byte_timeout:g} s"
            self._upstream_failed(HTTPStatus.GATEWAY_TIMEOUT, message, path)
            return self.error(HTTPStatus.GATEWAY_TIMEOUT, message, limits, errors)
        try:
            return await self._relay(request, upstream, path, limits, changes, errors)
        finally:
            upstream.release()  # back to the pool, or closed: a client gone mid-answer stops the upstream's work

    async def _relay(
        self,
        request: web.Request,
        upstream: Response,
        path: str,
        limits: Limits,
        changes: list[str],
        errors: ErrorShape,
    ) -> web.StreamResponse:
        headers = _without_hop_by_hop(upstream.headers)
        headers[LEVEL_HEADER] = limits.level.label
        if changes:
            headers[CLAMPED_HEADER] = ", ".join(changes)
        length = upstream.content_length
        if length is not None and length <= WHOLE_BODY_BYTES and not upstream.head_only:
            body = upstream.body_nowait()  # a small answer usually came with its headers
            if body is None:
                try:
                    async with deadline(self.settings.idle_timeout):
                        body = await upstream.read()
                except (Broken, asyncio.TimeoutError) as exc:
                    timed_out = isinstance(exc, asyncio.TimeoutError)
                    status = HTTPStatus.GATEWAY_TIMEOUT if timed_out else HTTPStatus.BAD_GATEWAY
                    message = f"upstream {self.settings.upstream} broke off its answer ({exc or 'timed out'})"
                    self._upstream_failed(status, message, path)
                    return self.error(status, message, limits, errors)
            return web.Response(status=upstream.status, reason=upstream.reason, body=body, headers=headers)
        first, problem = await self._next(upstream)  # before the status line: a failure now is a clean 502/504
        if problem is not None:
            self._upstream_failed(problem[0], problem[1], path)
            return self.error(problem[0], problem[1], limits, errors)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        if length is not None:
            response.content_length = length
        await response.prepare(request)
        problem = await self._stream(upstream, response, first)
        if problem is None:
            await response.write_eof()
            return response
        status, message = problem
        self._upstream_failed(status, message, path)
        self.log.emit("proxy_stream_cut", status=status.value, path=path, error=message)
        if upstream.content_type == "text/event-stream" and length is None:
            await response.write(errors.event(status, message))  # the client reads why, then a clean end
            await response.write_eof()
        elif request.transport is not None:
            request.transport.close()  # any other body: cut short, so the client sees it incomplete
        return response

    async def _next(self, upstream: Response) -> tuple[bytes, tuple[HTTPStatus, str] | None]:
        """The next piece of the upstream's body (b"" at its end), or why there is none."""
        idle = self.settings.idle_timeout
        try:
            async with deadline(idle):
                return await upstream.next_chunk(), None
        except asyncio.TimeoutError:
            return b"", (HTTPStatus.GATEWAY_TIMEOUT, f"upstream {self.settings.upstream} sent nothing for {idle:g} s")
        except Broken as exc:
            return b"", (HTTPStatus.BAD_GATEWAY, f"upstream {self.settings.upstream} broke off ({exc})")

    async def _stream(
        self, upstream: Response, response: web.StreamResponse, chunk: bytes
    ) -> tuple[HTTPStatus, str] | None:
        """Copy the upstream's body chunk by chunk, from `chunk`; why it had to stop early, or None."""
        while chunk:
            await response.write(chunk)  # a client that went away raises here: the handler is cancelled
            chunk, problem = await self._next(upstream)
            if problem is not None:
                return problem
        return None


def _without_hop_by_hop(headers: Any) -> CIMultiDict:
    """Headers to pass on: all but the hop-by-hop ones (repeated ones such as Set-Cookie kept, in order)."""
    kept = CIMultiDict(headers)
    for name in _HOP_BY_HOP_NAMES:
        if name in kept:
            kept.popall(name)
    for name in _connection_tokens(headers.get("Connection")):
        kept.popall(name, None)
    return kept


def _transfer_coded(value: str | None) -> bool:
    """A Transfer-Encoding with a coding besides chunked (gzip, ...): the server only de-chunks such a body, so it
    would be forwarded still coded, unlabelled (RFC 9112 6.1: 501)."""
    return value is not None and any(coding.strip().lower() != "chunked" for coding in value.split(","))


def _connection_tokens(value: str | None) -> frozenset[str]:
    """Header names a Connection header lists: hop-by-hop as well (RFC 9110 7.6.1)."""
    if not value:
        return frozenset()
    return frozenset(token.strip().lower() for token in value.split(","))


def mount(
    app: web.Application,
    settings: ProxySettings,
    limits: Callable[[], Limits],
    registry: CollectorRegistry,
    log: EventLog,
    priorities: Priorities | None = None,
) -> AdmissionProxy:
    """Mount the proxy on an application (the watcher's, or one of its own): it reads the limits in force
    in-process, per request, and counts into the registry behind /kvops/metrics; `priorities` (the policy's)
    class each request by its PRIORITY_HEADER."""
    proxy = AdmissionProxy(settings, limits, ProxyMetrics(registry), log, priorities)
    proxy.attach(app)
    return proxy
