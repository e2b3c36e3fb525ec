"""The watcher's own HTTP endpoints, under /kvops/ on `--listen`: metrics, policy, status, healthz.

`create_app(watcher, interval, token=...)` returns the aiohttp application with the watcher stored under `WATCHER`
and the registry behind /kvops/metrics under `REGISTRY`. The admission proxy either adds its routes to the same
application (the /kvops/ routes, added first, keep matching first) or serves an application of its own; either way
it reads the watcher's limits in-process and registers its metrics on `app[REGISTRY]`.

With a token, every /kvops/ endpoint but /kvops/healthz (what Kubernetes probes, which send no credentials, read)
answers 401 unless the request carries `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvops.policy import ACTIONS, Level
from kvops.watch.watcher import Watcher

WATCHER = web.AppKey("kvops_watcher", Watcher)
INTERVAL = web.AppKey("kvops_interval", float)
REGISTRY = web.AppKey("kvops_registry", CollectorRegistry)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def create_app(watcher: Watcher, interval: float, token: str | None = None) -> web.Application:
    app = web.Application(middlewares=[_require_token(token)] if token else [])
    app[WATCHER] = watcher
    app[INTERVAL] = interval
    app[REGISTRY] = CollectorRegistry(auto_describe=True)
    app[REGISTRY].register(WatcherCollector(watcher))
    app.router.add_get("/kvops/metrics", _metrics)
    app.router.add_get("/kvops/policy", _policy)
    app.router.add_get("/kvops/status", _status)
    app.router.add_get("/kvops/healthz", _healthz)
    return app


def _require_token(token: str) -> Callable:
    """Middleware: the protected endpoints need the bearer token (compared in constant time)."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Callable[[web.Request], Awaitable]) -> web.StreamResponse:
        route = request.match_info.route
        if route.handler not in _PROTECTED:
            return await handler(request)  # /kvops/healthz, and the proxy's catch-all when it shares the app
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if hmac.compare_digest(given, expected):
            return await handler(request)
        return web.json_response(
            {"error": "this endpoint needs Authorization: Bearer <the watcher's admin token>"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="kvops"'},
        )

    return check


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[REGISTRY]), headers={"Content-Type": CONTENT_TYPE})


async def _policy(request: web.Request) -> web.Response:
    return _json(request.app[WATCHER].current.policy_document())


async def _status(request: web.Request) -> web.Response:
    return _json(request.app[WATCHER].current.to_dict())


async def _healthz(request: web.Request) -> web.Response:
    """200 while the poll loop is alive. An engine without usable metrics is not the watcher's ill health."""
    watcher = request.app[WATCHER]
    age = None if watcher.last_poll_at is None else watcher.clock() - watcher.last_poll_at
    alive = age is None or age <= 3 * request.app[INTERVAL] + 10
    body = {
        "status": "ok" if alive else "stalled",
        "polls": watcher.polls,
        "last_poll_age_seconds": age,
        "level": watcher.current.level.label,
    }
    return _json(body, status=200 if alive else 503)


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


_PROTECTED = frozenset({_metrics, _policy, _status})


class WatcherCollector(Collector):
    """The watcher's state at scrape time, in client_python's custom-collector style."""

    def __init__(self, watcher: Watcher):
        self.watcher = watcher

    def collect(self) -> Iterator:
        w, snapshot = self.watcher, self.watcher.current
        label = w.source.replica_label
        yield _gauge(
            "kvops_level",
            "Pressure level: -1 unknown, 0 ok, 1 warn, 2 degrade, 3 critical (the fleet's worst).",
            [([], int(snapshot.level))],
        )
        yield _gauge(
            "kvops_kv_cache_usage_ratio",
            "KV-cache usage 0-1 (the fleet's highest); absent while unknown.",
            [] if snapshot.kv_usage is None else [([], snapshot.kv_usage)],
        )
        in_force = {a.split(":")[0] for a in snapshot.limits.actions()}
        yield _gauge(
            "kvops_action_in_force",
            "1 if the limits now in force take this action.",
            [([a], int(a in in_force)) for a in ACTIONS],
            ["action"],
        )
        if snapshot.limits.max_tokens_cap is not None:
            yield _gauge(
                "kvops_max_tokens_cap",
                "Cap on max new tokens per request now in force.",
                [([], snapshot.limits.max_tokens_cap)],
            )
        yield _gauge(
            "kvops_replica_level",
            "Pressure level per replica.",
            [([r.name], int(r.level)) for r in w.replicas.values()],
            [label],
        )
        yield _gauge(
            "kvops_replica_kv_cache_usage_ratio",
            "KV-cache usage per replica.",
            [([r.name], r.reading.kv_usage) for r in w.replicas.values() if r.reading and r.level != Level.UNKNOWN],
            [label],
        )
        yield from _headroom(w, snapshot, label)
        yield _gauge(
            "kvops_signal_firing",
            "1 while a saturation signal fires.",
            [([r.name, s.name], int(s.firing)) for r in w.replicas.values() for s in r.signal_states],
            [label, "signal"],
        )
        yield _gauge(
            "kvops_consecutive_poll_failures",
            "Polls in a row without usable metrics.",
            [([r.name], r.consecutive_failures) for r in w.replicas.values()],
            [label],
        )
        yield _counter(
            "kvops_poll_failures",
            "Polls that gave no usable metrics, per replica.",
            [([r.name], r.failures_total) for r in w.replicas.values()],
            [label],
        )
        yield _counter("kvops_polls", "Polls of the metrics source.", [([], w.polls)])
        yield _counter(
            "kvops_level_changes",
            "Level changes, by the level entered.",
            [([lvl], n) for lvl, n in w.level_changes.items()],
            ["level"],
        )
        yield _counter(
            "kvops_alerts_sent",
            "Alerts delivered to the webhook, by status.",
            [([s], n) for s, n in w.alerts_sent.items()],
            ["status"],
        )
        yield _counter("kvops_webhook_failures", "Failed deliveries to the webhook.", [([], w.webhook_failures)])
        yield _gauge("kvops_alerts_firing", "Alerts firing now.", [([], len(w.book.firing))])
        yield _gauge("kvops_last_poll_duration_seconds", "How long the last poll took.", [([], w.last_poll_seconds)])
        yield _gauge(
            "kvops_last_poll_timestamp_seconds",
            "When the last poll ended (unix time).",
            [([], snapshot.updated_at)] if w.polls else [],
        )


def _headroom(w: Watcher, snapshot, label: str) -> Iterator:
    """KV headroom per replica and for the fleet (kvops/watch/headroom.py), and llm-d's saturation score."""
    known = [r for r in w.replicas.values() if r.known and r.headroom]
    for name, field, documentation in (
        ("usable_tokens", "usable_tokens", "KV tokens of the pool (what KV usage is a fraction of)."),
        ("demand_tokens", "demand_tokens", "KV tokens demanded: in flight (max of in use, running x R) + waiting x R."),
        ("headroom_tokens", "headroom_tokens", "KV tokens left: the pool less the demand (negative: short)."),
    ):
        yield _gauge(
            f"kvops_replica_kv_{name}",
            f"{documentation} Per replica.",
            [([r.name], getattr(r.headroom, field)) for r in known],
            [label],
        )
        fleet = snapshot.headroom
        yield _gauge(f"kvops_kv_{name}", f"{documentation} The fleet's sum.", [([], fleet[field])] if fleet else [])
    yield _gauge(
        "kvops_kv_demand_ratio",
        "The fleet's KV demand over its pool: what autoscaling on headroom targets (scale out above the warn level).",
        [([], snapshot.headroom["demand_ratio"])] if snapshot.headroom else [],
    )
    yield _gauge(
        "kvops_replica_request_tokens",
        "R: the KV tokens one request is projected to hold at its peak (policy headroom.request_tokens, else the context).",
        [([r.name], r.headroom.request_tokens) for r in known if r.headroom],
        [label],
    )
    yield _gauge(
        "kvops_replica_saturation",
        "llm-d's endpoint score at the policy's gateway levels: max(waiting / queue depth, KV usage / degrade level).",
        [([r.name], r.saturation) for r in w.replicas.values() if r.known and r.saturation is not None],
        [label],
    )
    yield _gauge(
        "kvops_replica_waiting_for_capacity",
        "Waiting requests held back for KV or batch room (vLLM's num_requests_waiting_by_reason, reason capacity).",
        [
            ([r.name], r.reading.waiting_for_capacity)
            for r in w.replicas.values()
            if r.known and r.reading and r.reading.waiting_for_capacity is not None
        ],
        [label],
    )


def _gauge(name: str, documentation: str, samples: list, labels: list[str] | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels or [])
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _counter(name: str, documentation: str, samples: list, labels: list[str] | None = None) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels or [])
    for values, value in samples:
        family.add_metric(values, value)
    return family
