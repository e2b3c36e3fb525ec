"""Following the watcher's `GET /kvops/policy` from a background thread, off the scheduling path.

The contract: {"level": "ok|warn|degrade|critical|unknown", "kv_usage": 0.73 or null, "limits": Limits.to_dict(),
"updated_at": <unix seconds>, "source": "<where the watcher reads usage>"}. The scheduler only ever reads the
last good reading (one attribute, replaced whole); a watcher that is down, slow, answers garbage or has not
updated for max_age seconds yields None, and the scheduler applies no level meanwhile (or its own KV usage's,
with KVOPS_LEVELS=own).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from kvops.policy import Level, Limits, PolicyError


@dataclass(frozen=True)
class WatcherReading:
    level: Level
    limits: Limits
    kv_usage: float | None
    updated_at: float
    source: str


def parse_reading(document: Any) -> WatcherReading:
    """A /kvops/policy body as a reading; ValueError names the field at fault."""
    if not isinstance(document, dict):
        raise ValueError("body is not a JSON object")
    try:
        level = Level.parse(str(document.get("level")))
    except ValueError as exc:
        raise ValueError(f"level: {exc}") from None
    try:
        limits = Limits.from_dict(document.get("limits"), "limits")
    except PolicyError as exc:
        raise ValueError(str(exc)) from None
    usage = document.get("kv_usage")
    if usage is not None and not (
        isinstance(usage, (int, float)) and not isinstance(usage, bool) and 0.0 <= usage <= 1.0
    ):
        raise ValueError(f"kv_usage {usage!r} is not a fraction in [0, 1] or null")
    updated_at = document.get("updated_at")
    if not (isinstance(updated_at, (int, float)) and not isinstance(updated_at, bool) and math.isfinite(updated_at)):
        raise ValueError(f"updated_at {updated_at!r} is not unix seconds")
    return WatcherReading(
        level, limits, None if usage is None else float(usage), float(updated_at), str(document.get("source", ""))
    )


class PolicyFollower:
    """Polls the watcher every `interval` seconds; `reading()` is the last good, fresh reading or None."""

    def __init__(
        self,
        url: str,
        *,
        interval: float,
        timeout: float,
        max_age: float,
        logger: logging.Logger,
        fallback: str = "levels from own KV usage",
    ):
        self.url = url
        self.fallback = fallback  # what the guard does while the watcher is unusable, for the log line
        self.interval = interval
        self.timeout = timeout
        self.max_age = max_age
        self.logger = logger
        self._reading: WatcherReading | None = None
        self._problem: str | None = "not read yet"
        self._stop = threading.Event()
        self._polling = threading.Lock()  # one read at a time: a slow read never lands after a newer one
        self._thread = threading.Thread(target=self._run, name="kvops-policy-follower", daemon=True)

    def start(self) -> PolicyFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def reading(self, now: float | None = None) -> WatcherReading | None:
        reading = self._reading
        if reading is None or self._stale(reading, time.time() if now is None else now):
            return None
        return reading

    def poll(self) -> None:
        """One read of the watcher; logs only when it starts or stops being usable."""
        with self._polling:
            self._poll()

    def _poll(self) -> None:
        reading: WatcherReading | None
        try:
            reading = parse_reading(self._fetch())
            problem = None
            if self._stale(reading, time.time()):
                problem, reading = f"its updated_at is more than {self.max_age:g} s old", None
        except (OSError, ValueError) as exc:
            reading, problem = None, _describe(exc)
        self._reading = reading
        if problem != self._problem:
            if problem is None:
                self.logger.info("kvops guard: following the watcher at %s", self.url)
            else:
                self.logger.warning(
                    "kvops guard: watcher at %s unusable (%s); %s until it answers", self.url, problem, self.fallback
                )
            self._problem = problem

    def _fetch(self) -> Any:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read(1 << 20))

    def _stale(self, reading: WatcherReading, now: float) -> bool:
        return now - reading.updated_at > self.max_age

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)


def _describe(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    if isinstance(exc, json.JSONDecodeError):
        return "body is not JSON"
    return str(exc) or type(exc).__name__
