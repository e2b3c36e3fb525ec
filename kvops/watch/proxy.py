"""The admission proxy: the engine's API on the watcher's --listen address, the level in force applied per request.

Guarded requests (POST to OpenAI-compatible /v1/completions and /v1/chat/completions, TGI /generate and
/generate_stream) are read, clamped with `kvops.policy.clamp` (max new tokens capped, n / best_of / beam width
forced to 1) or, at critical, answered 503 with Retry-After in the upstream's own error shape without touching
the upstream. Everything else is forwarded untouched. Responses stream back chunk by chunk as they arrive
(server-sent events included); a client that disconnects cancels the upstream request (the server must run with
aiohttp's handler_cancellation). Headers are forwarded, never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from kvops.policy import Limits, RequestParams, clamp

if TYPE_CHECKING:
    from aiohttp import ClientSession, web
    from prometheus_client import CollectorRegistry

log = logging.getLogger("kvops.proxy")

OPENAI_PATHS = {"/v1/completions", "/v1/chat/completions"}
TGI_PATHS = {"/generate", "/generate_stream"}
# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp recomputes; everything else passes both ways.
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}
LEVEL_HEADER = "X-KVops-Level"
CLAMPED_HEADER = "X-KVops-Clamped"


@dataclass(frozen=True)
class ProxySettings:
    upstream: str  # e.g. http://127.0.0.1:8000
    engine: str = "vllm"  # vllm | tgi: decides the error shape and the default token-limit field
    max_body_bytes: int = 8 << 20
    connect_timeout: float = 5.0
    timeout: float = 600.0  # whole upstream exchange, streaming included


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
            "Requests answered 503 at critical without reaching the upstream.",
            registry=registry,
        )
        self.refused = Counter(
            "kvops_proxy_refused",
            "Requests the proxy refused as malformed (400) or too large (413).",
            ["status"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "kvops_proxy_upstream_errors",
            "Upstream failures answered 502 (unreachable) or 504 (timed out).",
            ["status"],
            registry=registry,
        )


class AdmissionProxy:
    def __init__(self, settings: ProxySettings, limits: Callable[[], Limits], metrics: ProxyMetrics):
        self.settings = settings
        self.limits = limits
        self.metrics = metrics
        self.session: ClientSession | None = None

    def attach(self, app: web.Application) -> None:
        """Add the catch-all route (after the app's own routes, which keep matching first) and the client session."""
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)

    async def _open(self, app: web.Application) -> None:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector

        timeout = ClientTimeout(total=self.settings.timeout, sock_connect=self.settings.connect_timeout)
        self.session = ClientSession(
            self.settings.upstream, timeout=timeout, connector=TCPConnector(limit=0), auto_decompress=False
        )

    async def _close(self, app: web.Application) -> None:
        if self.session:
            await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        limits = self.limits()
        guarded = request.method == "POST" and request.path in OPENAI_PATHS | TGI_PATHS
        self.metrics.requests.labels(limits.level.label, str(guarded).lower()).inc()
        if not guarded:
            return await self.forward(request, request.content.iter_any() if request.body_exists else None, limits, [])
        raw, body, refusal = await self._read_json(request)
        if refusal is not None:
            return refusal
        if limits.reject:
            self.metrics.rejected.inc()
            return self.error(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"KV cache pressure is critical; retry in {limits.retry_after_seconds} s",
                limits,
                retry_after=limits.retry_after_seconds,
            )
        changes = apply_limits(body, request.path, limits, self.settings.engine)
        for change in changes:
            self.metrics.clamped.labels(change.split(" ")[0]).inc()
        return await self.forward(request, json.dumps(body).encode() if changes else raw, limits, changes)

    async def _read_json(self, request: web.Request) -> tuple[bytes, dict[str, Any], web.Response | None]:
        """The body as sent and as parsed, or the 400/413 answer that refuses it."""
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return (
                b"",
                {},
                self._refuse(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"request body of {request.content_length} bytes exceeds the proxy's limit of {limit} bytes",
                ),
            )
        buffer = bytearray()
        async for chunk in request.content.iter_any():
            buffer += chunk
            if len(buffer) > limit:
                return (
                    b"",
                    {},
                    self._refuse(
                        HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body exceeds the proxy's limit of {limit} bytes"
                    ),
                )
        raw = bytes(buffer)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return (
                b"",
                {},
                self._refuse(
                    HTTPStatus.BAD_REQUEST, f"request body is not JSON ({getattr(exc, 'msg', exc.__class__.__name__)})"
                ),
            )
        problem = "request body must be a JSON object" if not isinstance(body, dict) else malformed(body, request.path)
        if problem:
            return b"", {}, self._refuse(HTTPStatus.BAD_REQUEST, problem)
        return raw, body, None

    def _refuse(self, status: HTTPStatus, message: str) -> web.Response:
        self.metrics.refused.labels(str(status.value)).inc()
        return self.error(status, message, self.limits())

    def error(self, status: HTTPStatus, message: str, limits: Limits, retry_after: int | None = None) -> web.Response:
        """An error in the upstream's own shape (vLLM's OpenAI ErrorResponse, or TGI's {error, error_type})."""
        from aiohttp import web

        if self.settings.engine == "tgi":
            payload: dict[str, Any] = {
                "error": message,
                "error_type": "overloaded" if status == HTTPStatus.SERVICE_UNAVAILABLE else "validation",
            }
        else:
            payload = {
                "error": {
                    "message": message,
                    "type": _OPENAI_ERROR_TYPES.get(status, "BadRequestError"),
                    "param": None,
                    "code": status.value,
                }
            }
        headers = {LEVEL_HEADER: limits.level.label}
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return web.json_response(payload, status=status.value, headers=headers)

    async def forward(self, request: web.Request, data: Any, limits: Limits, changes: list[str]) -> web.StreamResponse:
        from aiohttp import ClientConnectionError, web

        headers = {name: value for name, value in request.headers.items() if name.lower() not in _HOP_BY_HOP}
        if request.content_length is not None and not isinstance(data, bytes):
            headers["Content-Length"] = str(request.content_length)  # streamed through untouched: same framing
        try:
            async with self.session.request(
                request.method, request.rel_url, headers=headers, data=data, allow_redirects=False
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        response.headers.add(name, value)
                response.headers[LEVEL_HEADER] = limits.level.label
                if changes:
                    response.headers[CLAMPED_HEADER] = ", ".join(changes)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except asyncio.TimeoutError:
            self.metrics.upstream_errors.labels("504").inc()
            return self.error(
                HTTPStatus.GATEWAY_TIMEOUT,
                f"upstream {self.settings.upstream} did not answer within {self.settings.timeout:g} s",
                limits,
            )
        except ClientConnectionError as exc:
            if request.transport is None or request.transport.is_closing():
                raise  # the client went away mid-stream; nothing to answer
            self.metrics.upstream_errors.labels("502").inc()
            return self.error(
                HTTPStatus.BAD_GATEWAY,
                f"upstream {self.settings.upstream} unreachable ({exc.__class__.__name__})",
                limits,
            )


_OPENAI_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "BadRequestError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
    HTTPStatus.BAD_GATEWAY: "InternalServerError",
    HTTPStatus.GATEWAY_TIMEOUT: "InternalServerError",
}


def malformed(body: dict[str, Any], path: str) -> str | None:
    """Why a guarded body's limit fields cannot be read, or None."""
    fields = body.get("parameters", {}) if path in TGI_PATHS else body
    if path in TGI_PATHS and not isinstance(fields, dict):
        return '"parameters" must be a JSON object'
    for name in ("max_tokens", "max_completion_tokens", "max_new_tokens", "n", "best_of"):
        value = fields.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return f'"{name}" must be a positive integer, got {json.dumps(value)}'
    if "use_beam_search" in fields and not isinstance(fields["use_beam_search"], bool):
        return '"use_beam_search" must be true or false'
    return None


def apply_limits(body: dict[str, Any], path: str, limits: Limits, engine: str) -> list[str]:
    """Clamp a guarded request body in place; return what changed."""
    if path in TGI_PATHS:
        fields = body.setdefault("parameters", {})
        token_fields = ["max_new_tokens"]
        default_field = "max_new_tokens"
    else:
        fields = body
        token_fields = [name for name in ("max_tokens", "max_completion_tokens") if fields.get(name) is not None]
        default_field = (
            "max_completion_tokens" if path.endswith("/chat/completions") and engine == "vllm" else "max_tokens"
        )
    present = [fields[name] for name in token_fields if fields.get(name) is not None]
    beams = fields.get("n", 1) if fields.get("use_beam_search") else None
    params = RequestParams(
        max_tokens=min(present) if present else None,
        n=fields.get("n") or 1,
        best_of=fields.get("best_of"),
        beam_width=beams,
    )
    clamped, changes = clamp(params, limits)
    if clamped.max_tokens != params.max_tokens:
        for name in token_fields if present else [default_field]:
            fields[name] = clamped.max_tokens
    if clamped.n != params.n or clamped.beam_width != params.beam_width:
        fields["n"] = 1
    if clamped.best_of != params.best_of:
        fields["best_of"] = 1
    if beams is not None:  # with beam search, n is the beam width: report it once, as beam_width
        changes = [change for change in changes if not change.startswith("n ")]
    return changes


def attach_to_watcher(app: web.Application, settings: ProxySettings) -> AdmissionProxy:
    """Mount the proxy on the watcher's --listen server: it reads the watcher's limits in-process, per request."""
    from kvops.watch.server import REGISTRY, WATCHER

    watcher = app[WATCHER]
    proxy = AdmissionProxy(settings, lambda: watcher.current.limits, ProxyMetrics(app[REGISTRY]))
    proxy.attach(app)
    return proxy
