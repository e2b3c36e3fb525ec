"""The kvops degrade policy inside vLLM's own API server: `vllm serve ... --middleware
kvops_vllm.middleware.KVOpsMiddleware`. No second process and no second hop.

vLLM 0.32.0 adds a `--middleware` class with `app.add_middleware(cls)` after its own middleware
(`vllm/entrypoints/serve/middleware/register.py`, `init_entrypoints_middleware`), so it wraps them all: it sees
each request before vLLM's CORS, API-key and request-id middleware, and Starlette builds it once, at startup,
after the engine client (and so the stat loggers) exists (`vllm/entrypoints/launchers/app.py`, `build_app`).

Per request on a generation route (`kvops.engines.vllm.api.ROUTES`, matched on `kvops.watch.guard.canonical_path`
of the path Starlette routes on), the level comes from the engine's KV usage this process already holds
(`stats.GaugeUsage`) through the shared policy's `LevelTracker` (thresholds, hysteresis and the admission's own
dwell, `Policy.for_admission`); then, as the
admission proxy does, with the same pure functions (`kvops.watch.guard`): a level that refuses the request's class
answers 429 (sheddable) or 503 with `Retry-After` in the route's own error shape, before the body is read; a level
that clamps reads the body, parses it within the proxy's limits (a body it cannot read is 400) and hands vLLM the
clamped JSON (max new tokens capped; n, best_of, beam width 1); level ok reads nothing. Guarded answers carry
`X-KVops-Level`, clamped ones `X-KVops-Clamped`. Every other path, method and websocket passes untouched.

The body vLLM parses is the body the middleware parsed: the same bytes, through the same `json.loads` (FastAPI's
`Request.json`, after vLLM's `validate_json_request` required `application/json`), in the same process, so there
is no framing or encoding for the two to read differently.

Request classes (`kvops.policy.Priorities`), as the proxy reads them: `X-KVops-Priority` (a vLLM priority) counts
only from the networks in `KVOPS_TRUST_PRIORITY_FROM` (a gateway that sets it); every other request is standard, so a
client reaching the engine directly cannot claim a class. A request of several prompts counts as that many where the
level runs one sequence per request (`Limits.batch_refusal`: 429). Settings in the environment of `vllm serve`:

KVOPS_POLICY                the policy YAML (the same file as `kvops watch` and the KV guard; default: the shipped one)
KVOPS_TRUST_PRIORITY_FROM   CIDR[,CIDR]: the gateway's networks, as `kvops watch --trust-priority-from` (default: none)

A KVOPS_* name no kvops process reads (a misspelling) stops the startup with one line (`kvops.settings.check_names`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from kvops.engines.api import ErrorShape, Route
from kvops.engines.vllm.api import ROUTES
from kvops.errors import KvopsError
from kvops.policy import Level, LevelTracker, Limits, Policy, Priorities, Refusal, RequestClass, load_policy
from kvops.settings import check_names
from kvops.watch.guard import (
    PRIORITY_HEADER,
    BodyError,
    Network,
    apply_limits,
    canonical_path,
    encode_body,
    is_trusted,
    parse_body,
    parse_networks,
    prompt_count,
    request_class,
    sites,
)
from kvops_vllm.stats import GaugeUsage

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The admission proxy's response headers (kvops/watch/proxy.py), so clients read both alike.
LEVEL_HEADER = b"x-kvops-level"
CLAMPED_HEADER = b"x-kvops-clamped"
_PRIORITY = PRIORITY_HEADER.lower().encode()  # ASGI servers hand header names over in lower case
_LEVELS = {level: level.label.encode() for level in Level}  # X-KVops-Level values, encoded once

# Under vLLM's logger tree, so the lines come out in the API server's own log format.
logger = logging.getLogger("vllm.kvops_middleware")


class MiddlewareConfigError(KvopsError):
    """A KVOPS_* variable the middleware cannot use, or a vLLM launch it cannot level."""


@dataclass(frozen=True)
class MiddlewareSettings:
    policy: Policy
    policy_source: str  # the YAML path, or "shipped default"
    trust_priority_from: tuple[Network, ...] = ()  # whose X-KVops-Priority counts; none: every request is standard

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MiddlewareSettings:
        env = os.environ if env is None else env
        check_names(env, MiddlewareConfigError)
        path = env.get("KVOPS_POLICY") or None
        try:
            trusted = parse_networks(env.get("KVOPS_TRUST_PRIORITY_FROM") or "")
        except ValueError as exc:
            raise MiddlewareConfigError(f"KVOPS_TRUST_PRIORITY_FROM: {exc}") from None
        return cls(load_policy(path), path or "shipped default", trusted)


class Counters:
    """What the middleware did, on vLLM's own /metrics (its Prometheus registry; summed over API servers)."""

    def __init__(self, registry: Any):
        from prometheus_client import Counter, Gauge

        def metric(kind: Any, name: str, documentation: str, **options: Any) -> Any:
            known = registry._names_to_collectors.get(name)  # a second instance in one process shares them
            return known if known is not None else kind(name, documentation, registry=registry, **options)

        requests = metric(
            Counter, "kvops_middleware_requests", "Guarded requests, by the level in force.", labelnames=["level"]
        )
        self.requests = {level: requests.labels(level.label) for level in Level}
        self._clamped = metric(
            Counter,
            "kvops_middleware_clamped",
            "Request fields the middleware changed, by field.",
            labelnames=["field"],
        )
        rejected = metric(
            Counter,
            "kvops_middleware_rejected",
            "Requests the level refused (429 sheddable, 503 standard), by status.",
            labelnames=["status"],
        )
        refused = metric(
            Counter, "kvops_middleware_refused", "Guarded requests refused as malformed (400).", labelnames=["status"]
        )
        # bound up front, so that each series exists (at 0) before the first refusal: rates and alerts see it start
        self.rejected = {status: rejected.labels(str(status)) for status in (429, 503)}
        self.refused = refused.labels("400")
        self.level = metric(
            Gauge,
            "kvops_middleware_level",
            "The level in force (unknown -1, ok 0, warn 1, degrade 2, critical 3); with several API servers the highest.",
            multiprocess_mode="livemax",
        )
        self._fields: dict[str, Any] = {}  # field -> its bound counter: labels() takes a lock and builds a key

    def clamped(self, change: str) -> None:
        """Count one change ('max_tokens 1024->512') by its field."""
        field = change.split(" ", 1)[0]
        counter = self._fields.get(field)
        if counter is None:
            counter = self._fields[field] = self._clamped.labels(field)
        counter.inc()


class KVOpsMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware: responses stream through untouched but for two headers)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: MiddlewareSettings | None = None,
        usage: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        registry: Any = None,
    ) -> None:
        self.app = app
        try:
            self.settings = settings or MiddlewareSettings.from_env()
            self.usage = usage or _engine_usage()
        except KvopsError as exc:
            logger.error("kvops middleware: %s", exc)  # one line above the traceback that stops vLLM's startup
            raise
        self.clock = clock
        self.tracker = LevelTracker(self.settings.policy.for_admission())
        self.priorities: Priorities = self.settings.policy.priorities
        self.counters = Counters(registry if registry is not None else _default_registry())
        self._limits = self.tracker.limits()
        logger.info("kvops middleware: %s", self.describe())

    def describe(self) -> str:
        policy, settings = self.settings.policy, self.settings
        levels = ", ".join(f"{level.label} {policy.thresholds[level]:.0%}" for level in policy.thresholds)
        trusted = ", ".join(str(network) for network in settings.trust_priority_from)
        classes = f"classes from {PRIORITY_HEADER} sent from {trusted}" if trusted else "every request standard"
        return (
            f"levels from this API server's KV usage, policy {settings.policy_source} ({levels}, hysteresis "
            f"{policy.hysteresis:.0%}, dwell {policy.for_admission().min_dwell_seconds:g} s); {classes}"
        )

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        route = ROUTES.match(scope["method"], canonical_path(_route_path(scope)))
        if route is None:
            return self.app(scope, receive, send)
        return self._guard(route, scope, receive, send)

    def limits(self) -> Limits:
        """The limits in force now: the tracker fed this process's latest reading of the engine's KV usage."""
        before = self.tracker.level
        usage = self.usage()
        level = self.tracker.update(usage, self.clock())
        if level != before:
            self._limits = self.tracker.limits()
            self._level_changed(before, usage)
        return self._limits

    def _level_changed(self, before: Level, usage: float | None) -> None:
        limits = self._limits
        reading = "no KV usage" if usage is None else f"KV {usage:.1%}"
        effects = ", ".join(limits.effects()) or "no limits"
        logger.info("kvops middleware: level %s -> %s (%s): %s", before.label, limits.level.label, reading, effects)
        self.counters.level.set(int(limits.level))

    async def _guard(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        limits = self.limits()
        self.counters.requests[limits.level].inc()
        try:
            klass = self._request_class(scope)
        except BodyError as problem:
            return await self._refuse(send, problem, route.errors, limits)
        refusal = limits.refusal(klass)
        if refusal is not None:  # before reading the body: under pressure, spend as little as possible
            return await self._reject(send, refusal, route.errors, limits)
        level = [(LEVEL_HEADER, _LEVELS[limits.level])]
        if not route.json or (limits.max_tokens_cap is None and not limits.single_sequence):
            return await self.app(scope, receive, _with_headers(send, level))
        raw = await _read_body(receive)
        if raw is None:
            return None  # the client went away before it finished sending: nothing to answer
        try:
            body = parse_body(raw)
            found = sites(route, body)
        except BodyError as problem:
            return await self._refuse(send, problem, route.errors, limits)
        refusal = limits.batch_refusal(sum(prompt_count(site.item) for site in found), klass)
        if refusal is not None:  # a list of prompts where the level runs one sequence per request
            return await self._reject(send, refusal, route.errors, limits)
        changes = apply_limits(found, limits)
        if changes:
            raw = encode_body(body)
            scope = _with_length(scope, len(raw))
            level.append((CLAMPED_HEADER, ", ".join(changes).encode()))
            for change in changes:
                self.counters.clamped(change)
        return await self.app(scope, _replay(raw, receive), _with_headers(send, level))

    def _request_class(self, scope: Scope) -> RequestClass:
        """By X-KVops-Priority when a trusted network sent it (as the proxy reads it), else standard."""
        trusted = self.settings.trust_priority_from
        client = scope.get("client")
        if not trusted or not client or not is_trusted(client[0], trusted):
            return self.priorities.request_class(0)
        value = next((v for k, v in scope["headers"] if k == _PRIORITY), None)
        return request_class(None if value is None else value.decode("latin-1"), self.priorities)

    async def _reject(self, send: Send, refusal: Refusal, errors: ErrorShape, limits: Limits) -> None:
        self.counters.rejected[refusal.status].inc()
        retry = [(b"retry-after", str(refusal.retry_after_seconds).encode())]
        await _answer(send, HTTPStatus(refusal.status), refusal.message, errors, limits, retry)

    async def _refuse(self, send: Send, problem: BodyError, errors: ErrorShape, limits: Limits) -> None:
        """400: a body it cannot read where it must clamp (vLLM's own parser could not either), a bad priority header."""
        self.counters.refused.inc()
        await _answer(send, HTTPStatus(problem.status), str(problem), errors, limits)


def _engine_usage() -> GaugeUsage:
    """The engine's usage as vLLM's stat logger left it in this process; a launch without it cannot be levelled."""
    usage = GaugeUsage()
    if not usage.registered():
        raise MiddlewareConfigError(
            f"vLLM's {usage.name} is not in this process's metrics (--disable-log-stats?): the middleware levels on "
            "it; start vLLM with its stats on"
        )
    return usage


def _default_registry() -> Any:
    from prometheus_client import REGISTRY

    return REGISTRY


def _route_path(scope: Scope) -> str:
    """The path Starlette routes on: the request path less the app's root_path (starlette's get_route_path)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :]
    return path


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app `body` once, then the client's own messages (its disconnect, for vLLM to abort)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def _with_length(scope: Scope, length: int) -> Scope:
    """The scope with the clamped body's Content-Length (and no Transfer-Encoding: the body is whole)."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-length", b"transfer-encoding")]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *extra]
        await send(message)

    return sending


async def _answer(
    send: Send,
    status: HTTPStatus,
    message: str,
    errors: ErrorShape,
    limits: Limits,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An answer of the middleware's own, in the route's error shape (vLLM's ErrorResponse for the OpenAI routes)."""
    payload = json.dumps(errors.body(status, message)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (LEVEL_HEADER, _LEVELS[limits.level]),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status.value, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
