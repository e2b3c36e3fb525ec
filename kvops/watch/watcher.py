"""The poll loop: readings -> per-replica level (policy.LevelTracker) -> the fleet's worst -> limits, alerts, log.

`Watcher.current` is the latest `Snapshot`; anything in the same process (the /kvops/* endpoints, an admission
proxy mounted on the same server) reads the level and limits from it without HTTP. The watcher never raises for
its inputs: a replica with no usable metrics is `unknown`, counted, and after `stale_after_failures` consecutive
failures raises the metrics-stale alert. Before its first good reading the watcher is `unknown` with the limits the
policy gives missing data (`Policy.limits` with no last level: fail-closed applies critical's), not with none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, TextIO

from kvops.engines.metrics import MAX_SAMPLE, Reading
from kvops.frozen import frozen
from kvops.policy import GRADED, Level, LevelTracker, Limits, Policy
from kvops.watch.alerts import (
    LEVEL_ALERTS,
    SIGNAL_ALERTS,
    STALE_ALERT,
    Alert,
    AlertBook,
    AlertKind,
    catalogue,
    format_value,
    rfc3339,
)
from kvops.watch.headroom import Headroom, headroom
from kvops.watch.saturation import GatewayLevels
from kvops.watch.signals import SignalState, SignalTracker, floor
from kvops.watch.sources import MetricsSource, Poll, describe

if TYPE_CHECKING:
    import aiohttp

FORGET_AFTER_SECONDS = 300.0  # a replica absent from the source this long is dropped (Prometheus' lookback)


@dataclass
class Replica:
    """What the watcher knows of one engine replica."""

    name: str
    tracker: LevelTracker
    signals: SignalTracker
    reading: Reading | None = None
    error: str | None = None
    consecutive_failures: int = 0
    failures_total: int = 0
    last_seen: float = 0.0
    signal_states: list[SignalState] = field(default_factory=list)
    headroom: Headroom | None = None
    saturation: float | None = None  # llm-d's endpoint score at the policy's gateway levels

    @property
    def level(self) -> Level:
        return self.tracker.level

    @property
    def known(self) -> bool:
        return self.reading is not None and self.level != Level.UNKNOWN

    def to_dict(self, stale_after: int) -> dict:
        return {
            "name": self.name,
            "level": self.level.label,
            "kv_usage": self.reading.kv_usage if self.reading and self.level != Level.UNKNOWN else None,
            "reading": self.reading.to_dict() if self.reading and self.level != Level.UNKNOWN else None,
            "headroom": self.headroom.to_dict() if self.headroom and self.known else None,
            "saturation": self.saturation if self.known else None,
            "signals": [s.to_dict() for s in self.signal_states],
            "error": self.error,
            "consecutive_failures": self.consecutive_failures,
            "failures_total": self.failures_total,
            "stale": self.consecutive_failures >= stale_after,
        }


@frozen
class Snapshot:
    """The watcher's view after a poll: what /kvops/policy serves and `--once` prints."""

    level: Level
    kv_usage: float | None
    limits: Limits
    updated_at: float
    source: str
    engine: str
    replicas: tuple[dict, ...] = ()
    alerts: tuple[str, ...] = ()
    polls: int = 0
    headroom: dict | None = None  # the fleet's: the sums over the replicas whose headroom is known

    @property
    def actions(self) -> list[str]:
        return self.limits.actions()

    def policy_document(self) -> dict:
        """The contract read by the admission proxy and the vLLM scheduler plugin."""
        return {
            "level": self.level.label,
            "kv_usage": self.kv_usage,
            "limits": self.limits.to_dict(),
            "updated_at": self.updated_at,
            "source": self.source,
        }

    def to_dict(self) -> dict:
        return {
            **self.policy_document(),
            "engine": self.engine,
            "actions": self.actions,
            "alerts": list(self.alerts),
            "replicas": list(self.replicas),
            "headroom": self.headroom,
            "polls": self.polls,
        }


class EventLog:
    """One JSON line per event (level change, poll failure, recovery, alert) on a stream."""

    def __init__(self, stream: TextIO | None = sys.stdout, wall: Callable[[], float] = time.time):
        self.stream, self.wall = stream, wall

    def emit(self, event: str, **fields) -> None:
        if self.stream is None:
            return
        self.stream.write(json.dumps({"time": rfc3339(self.wall()), "event": event, **fields}) + "\n")
        self.stream.flush()


class Watcher:
    def __init__(
        self,
        policy: Policy,
        engine: str,
        source: MetricsSource,
        *,
        webhook: str | None = None,
        runbook_url: str = "runbooks",
        generator_url: str | None = None,
        recorder=None,
        request_tokens: int | None = None,
        log: EventLog | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.policy, self.engine, self.source = policy, engine, source
        self.webhook, self.runbook_url, self.generator_url = webhook, runbook_url, generator_url
        self.recorder = recorder
        self.request_tokens = request_tokens or policy.request_tokens
        self.gateway = GatewayLevels.from_policy(policy)
        self.log = log or EventLog(None)
        self.clock, self.wall = clock, wall
        self.kinds: dict[str, AlertKind] = {kind.name: kind for kind in catalogue(policy, engine)}
        self.replicas: dict[str, Replica] = {}
        self.book = AlertBook()
        # the fleet's last level read; None until a replica has given a good reading, and until then the limits
        # are the policy's for missing data (fail-closed: critical's; fail-open: none), as after the grace
        self.fleet_last_known: Level | None = None
        self.polls = 0
        self.poll_failures_total = 0
        self.level_changes: dict[str, int] = {level.label: 0 for level in Level}
        self.alerts_sent = {"firing": 0, "resolved": 0}
        self.webhook_failures = 0
        self.last_poll_seconds = 0.0
        self.last_poll_at: float | None = None
        self._delivery: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self.current = Snapshot(Level.UNKNOWN, None, policy.limits(Level.UNKNOWN, None), wall(), source.url, engine)

    # --- one poll ---------------------------------------------------------------------------------------

    async def poll(self) -> Snapshot:
        started = time.perf_counter()
        try:
            result = await self.source.poll()
        except Exception as exc:  # a source's bug on an answer it did not foresee: missing data, never an exit
            result = Poll(error=f"the source failed: {describe(exc)}")
        now, wall = self.clock(), self.wall()
        self.polls += 1
        failures = dict(result.failures)
        if result.error:
            failures.update(dict.fromkeys(self.replicas, result.error) or {self.source.url: result.error})
        for name in [n for n in self.replicas if n not in result.readings and n not in failures]:
            if now - self.replicas[name].last_seen > FORGET_AFTER_SECONDS:
                del self.replicas[name]
            else:
                failures[name] = "absent from the source (target gone or series renamed)"
        for name, reading in result.readings.items():
            unusable = unusable_reading(reading)
            if unusable:
                failures[name] = unusable
            else:
                self._observe(self._replica(name, now), reading, now)
        for name, reason in failures.items():
            self._fail(self._replica(name, now), reason, now)
        self._alert(wall)
        self.current = self._snapshot(wall)
        if self.recorder is not None:
            try:
                self.recorder.write(self.current, self.replicas.values())
            except (OSError, ValueError) as exc:  # a full disk stops the record, not the watcher
                self.log.emit("record_failed", error=describe(exc))
        self.last_poll_seconds = time.perf_counter() - started
        self.last_poll_at = now
        return self.current

    def _replica(self, name: str, now: float) -> Replica:
        if name not in self.replicas:
            self.replicas[name] = Replica(
                name, LevelTracker(self.policy), SignalTracker(self.policy.signals), last_seen=now
            )
        return self.replicas[name]

    def _observe(self, replica: Replica, reading: Reading, now: float) -> None:
        if replica.consecutive_failures:
            self.log.emit(
                "poll_recovered",
                replica=replica.name,
                after_failures=replica.consecutive_failures,
                kv_usage=reading.kv_usage,
            )
        replica.reading, replica.error, replica.consecutive_failures, replica.last_seen = reading, None, 0, now
        replica.signal_states = replica.signals.update(reading, now)
        replica.headroom = headroom(reading, self.request_tokens)
        replica.saturation = self.gateway.score(reading.kv_usage, reading.waiting)
        before = replica.level
        after = replica.tracker.update(reading.kv_usage, now, floor(replica.signal_states))
        if after != before:
            self._level_changed(replica, before, after)

    def _fail(self, replica: Replica, reason: str, now: float) -> None:
        replica.consecutive_failures += 1
        replica.failures_total += 1
        self.poll_failures_total += 1
        before = replica.level if replica.tracker.last_good is not None else Level.UNKNOWN  # never read: not ok
        after = replica.tracker.update(None, now)  # the last level through the policy's grace, then unknown
        if reason != replica.error or replica.consecutive_failures == self.policy.stale_after_failures:
            stale = replica.consecutive_failures >= self.policy.stale_after_failures
            self.log.emit(
                "metrics_stale" if stale else "poll_failed",
                replica=replica.name,
                error=reason,
                consecutive_failures=replica.consecutive_failures,
                level=after.label,
            )
        replica.error = reason
        if after != before:
            self._level_changed(replica, before, after)

    def _level_changed(self, replica: Replica, before: Level, after: Level) -> None:
        self.level_changes[after.label] += 1
        limits = replica.tracker.limits()
        self.log.emit(
            "level_changed",
            replica=replica.name,
            **{"from": before.label},
            to=after.label,
            severity=_severity(after),
            kv_usage=replica.reading.kv_usage if after != Level.UNKNOWN and replica.reading else None,
            signals=[s.name for s in replica.signal_states if s.firing],
            error=replica.error if after == Level.UNKNOWN else None,
            actions=limits.actions(),
            limits=limits.to_dict(),
        )

    def _snapshot(self, wall: float) -> Snapshot:
        known = [r for r in self.replicas.values() if r.level != Level.UNKNOWN]
        level = max((r.level for r in known), default=Level.UNKNOWN)
        if level != Level.UNKNOWN:
            self.fleet_last_known = level
        kv_usage = max((r.reading.kv_usage for r in known if r.reading), default=None)
        if len(self.replicas) > 1 and level != self.current.level:
            self.log.emit(
                "fleet_level_changed",
                **{"from": self.current.level.label},
                to=level.label,
                severity=_severity(level),
                kv_usage=kv_usage,
                replicas={r.name: r.level.label for r in self.replicas.values()},
            )
        return Snapshot(
            level=level,
            kv_usage=kv_usage,
            limits=self.policy.limits(level, self.fleet_last_known),
            updated_at=wall,
            source=self.source.url,
            engine=self.engine,
            replicas=tuple(r.to_dict(self.policy.stale_after_failures) for r in self.replicas.values()),
            alerts=tuple(sorted({a.labels["alertname"] for a in self.book.firing.values()})),
            polls=self.polls,
            headroom=fleet_headroom([r.headroom for r in known if r.headroom]),
        )

    # --- alerts ------------------------------------------------------------------------------------------

    def _alert(self, wall: float) -> None:
        desired: list[Alert] = []
        for replica in self.replicas.values():
            if replica.level == Level.UNKNOWN:  # unknown is not resolved: hold what was firing
                desired += [
                    a
                    for a in self.book.firing.values()
                    if a.labels.get(self.source.replica_label) == replica.name and a.labels["alertname"] != STALE_ALERT
                ]
            else:
                desired += self._replica_alerts(replica)
            if replica.consecutive_failures >= self.policy.stale_after_failures:
                desired.append(
                    self._make(STALE_ALERT, replica, f"{replica.consecutive_failures} failed, last: {replica.error}")
                )
        for alert in self.book.reconcile(desired, wall):
            self.log.emit(
                "alert",
                status=alert.status,
                alertname=alert.labels["alertname"],
                severity=alert.labels["severity"],
                replica=alert.labels.get(self.source.replica_label),
                summary=alert.annotations["summary"],
            )
        if self.webhook is None:
            self.book.outbox.clear()
        elif self.book.outbox and (self._delivery is None or self._delivery.done()):
            self._delivery = asyncio.create_task(self._deliver(self.webhook))

    def _replica_alerts(self, replica: Replica) -> list[Alert]:
        reading = replica.reading
        if reading is None:
            return []
        alerts = [
            self._make(LEVEL_ALERTS[level], replica, reading.kv_usage) for level in GRADED if replica.level >= level
        ]
        for state in replica.signal_states:
            if state.firing and SIGNAL_ALERTS[state.name] in self.kinds:
                value = reading.running if state.name == "stall" else state.value
                alerts.append(self._make(SIGNAL_ALERTS[state.name], replica, value))
        return alerts

    def _make(self, name: str, replica: Replica, value: float | str | None) -> Alert:
        kind = self.kinds[name]
        labels = {
            "alertname": name,
            "severity": kind.severity,
            "serving_engine": self.engine,
            self.source.replica_label: replica.name,
        }
        text = value if isinstance(value, str) else format_value(kind.unit, value)
        return Alert(
            labels,
            kind.annotations(replica.name, text, self.runbook_url),
            starts_at=0.0,
            generator_url=self.generator_url,
        )

    async def _deliver(self, webhook: str) -> None:
        import aiohttp

        sending = self.book.take()
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
            async with self._session.post(webhook, json=[a.payload() for a in sending]) as response:
                if response.status >= 300:
                    raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        except Exception as exc:  # the receiver's problem must not stop the watcher; retried after the next poll
            self.webhook_failures += 1
            self.book.restore(sending)
            self.log.emit("webhook_failed", url=self.webhook, error=describe(exc), alerts=len(sending))
            return
        self.book.delivered(self.wall())
        for alert in sending:
            self.alerts_sent[alert.status] += 1

    # --- the loop ----------------------------------------------------------------------------------------

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """Poll every `interval` seconds until `stop` is set, the first time at once (or one interval after a poll
        already made); a slow poll skips the ticks it overran."""
        next_at = self.clock() if self.last_poll_at is None else self.last_poll_at + interval
        while not stop.is_set():
            now = self.clock()
            if now < next_at:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), next_at - now)
                continue
            await self.poll_or_stop(stop)
            next_at += interval
            now = self.clock()
            if next_at < now:
                next_at = now + interval - (now - next_at) % interval

    async def poll_or_stop(self, stop: asyncio.Event) -> None:
        """Poll, unless `stop` is set first: a poll waiting on a slow source is cancelled, so SIGTERM does not wait out
        --timeout (the poll had not changed anything yet: its row is not recorded)."""
        polling, stopping = asyncio.ensure_future(self.poll()), asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({polling, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (polling, stopping):
                task.cancel()
            await asyncio.gather(polling, stopping, return_exceptions=True)

    async def flush(self) -> None:
        """Wait for the delivery in flight, then send what is still in the outbox (one try)."""
        if self._delivery is not None and not self._delivery.done():
            await asyncio.wait({self._delivery}, timeout=15)
        if self.webhook and self.book.outbox:
            await self._deliver(self.webhook)

    async def close(self) -> None:
        await self.flush()
        if self._session is not None:
            await self._session.close()
        await self.source.close()


def unusable_reading(reading: Reading) -> str | None:
    """Why a reading cannot be used, or None. Each engine's reader refuses NaN, Inf and values past MAX_SAMPLE in
    what it reads; this holds it for every number a Reading carries (fields added later too), so one garbage
    value is missing data, with the policy's grace, not an overflow later in the headroom or an alert."""
    for item in fields(reading):
        value = getattr(reading, item.name)
        values = value.values() if isinstance(value, Mapping) else (value,)
        for number in values:
            if isinstance(number, (int, float)) and not isinstance(number, bool) and not _usable(number):
                return f"{item.name} is {number:g}: not a value an engine reports"
    if not 0.0 <= reading.kv_usage <= 1.0:
        return f"kv_usage is {reading.kv_usage:g}, outside 0-1"
    return None


def _usable(number: float) -> bool:
    return math.isfinite(number) and abs(number) <= MAX_SAMPLE


def fleet_headroom(parts: list[Headroom]) -> dict | None:
    """The fleet's pool, demand and headroom in KV tokens: what one autoscaler sees for all replicas."""
    if not parts:
        return None
    usable = sum(part.usable_tokens for part in parts)
    demand = sum(part.demand_tokens for part in parts)
    return {
        "replicas": len(parts),
        "usable_tokens": usable,
        "demand_tokens": round(demand),
        "headroom_tokens": round(usable - demand),
        "demand_ratio": demand / usable,
    }


def _severity(level: Level) -> str:
    return {Level.OK: "info", Level.UNKNOWN: "error"}.get(level, "warning" if level != Level.CRITICAL else "critical")
