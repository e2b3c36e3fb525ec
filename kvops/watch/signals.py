"""Saturation signals beyond KV %: queue growth, preemptions, stall, prefix-cache hit rate, the host KV tier.

Each is computed per replica from successive readings over its policy window, the way the matching alert rule
computes it in PromQL (`kvops alerts`): queue growth is `waiting - min_over_time(waiting[w])`, preemptions and
hit rate use counter increases (a counter that goes down was reset: the new value is the increase), a stall is
requests running while the generated-token counter has not moved for `seconds`; the host tier's load latency is
the seconds spent loading over the loads made within the window, its usage the engine's gauge.
"""

from __future__ import annotations

import itertools
from collections import deque

from kvops.engines.metrics import Reading
from kvops.frozen import frozen
from kvops.policy import Level, SignalRule


@frozen
class SignalState:
    name: str
    firing: bool
    value: float | None  # requests of growth, preemptions, seconds stalled, hit rate; None: not measurable yet
    raise_to: Level | None
    detail: str

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "firing": self.firing,
            "value": self.value,
            "raise_to": self.raise_to.label if self.raise_to else None,
            "detail": self.detail,
        }


def floor(states: list[SignalState]) -> Level:
    """The lowest level the firing signals allow."""
    return max((s.raise_to for s in states if s.firing and s.raise_to is not None), default=Level.OK)


class SignalTracker:
    """The signals of one replica, from the readings it has seen."""

    def __init__(self, rules: dict[str, SignalRule]):
        self.rules = rules
        longest = max((rule.window_seconds for rule in rules.values()), default=0.0)
        self.keep_seconds = longest
        self.history: deque[tuple[float, Reading]] = deque()
        self.progress_at: float | None = None  # last time tokens were generated (or nothing was running)

    def update(self, reading: Reading, now: float) -> list[SignalState]:
        previous = self.history[-1][1] if self.history else None
        self.history.append((now, reading))
        # the newest reading older than the longest window stays: a counter's baseline (`_since_window`)
        while len(self.history) > 1 and self.history[1][0] < now - self.keep_seconds:
            self.history.popleft()
        self._track_progress(previous, reading, now)
        return [self._evaluate(rule, reading, now) for rule in self.rules.values()]

    def _track_progress(self, previous: Reading | None, reading: Reading, now: float) -> None:
        idle = not reading.running
        moved = previous is None or previous.progress_total != reading.progress_total
        if self.progress_at is None or idle or moved:
            self.progress_at = now

    def _evaluate(self, rule: SignalRule, reading: Reading, now: float) -> SignalState:
        if rule.name == "queue_growth":
            return self._queue_growth(rule, now)
        if rule.name == "preemptions":
            return self._preemptions(rule, now)
        if rule.name == "stall":
            return self._stall(rule, reading, now)
        if rule.name == "offload_usage":
            return self._offload_usage(rule, reading)
        if rule.name == "offload_load_latency":
            return self._offload_latency(rule, now)
        return self._hit_rate(rule, now)

    def _window(self, rule: SignalRule, now: float, field: str) -> list[float]:
        values = [getattr(r, field) for t, r in self.history if t >= now - rule.window_seconds]
        return [] if any(v is None for v in values) else values

    def _since_window(self, rule: SignalRule, now: float, field: str) -> list[float]:
        """A counter's readings in the window, after the last one before it: polls slower than the window (a
        busy engine's /metrics) still see a counter that moved between them, where the window alone would hold
        one reading and see nothing."""
        start = now - rule.window_seconds
        before = [reading for t, reading in self.history if t < start][-1:]
        values = [getattr(r, field) for r in before] + self._window(rule, now, field)
        return [] if any(v is None for v in values) else values

    def _queue_growth(self, rule: SignalRule, now: float) -> SignalState:
        values = self._window(rule, now, "waiting")
        if not values:
            return SignalState(rule.name, False, None, rule.raise_to, "no waiting-queue gauge")
        growth = values[-1] - min(values)
        firing = growth > 0 and growth >= rule.min_growth
        return SignalState(
            rule.name,
            firing,
            growth,
            rule.raise_to,
            f"waiting queue grew by {growth:g} (from {min(values):g} to {values[-1]:g}) within {rule.window_seconds:g} s; alert at {rule.min_growth:g}",
        )

    def _preemptions(self, rule: SignalRule, now: float) -> SignalState:
        if self.history[-1][1].preemptions_total is None:
            return SignalState(rule.name, False, None, rule.raise_to, "the engine exports no preemption counter")
        values = self._since_window(rule, now, "preemptions_total")
        if len(values) < 2:
            return SignalState(rule.name, False, None, rule.raise_to, "needs two readings of the preemption counter")
        count = increase(values)
        return SignalState(
            rule.name, count > 0, count, rule.raise_to, f"{count:g} preemptions within {rule.window_seconds:g} s"
        )

    def _stall(self, rule: SignalRule, reading: Reading, now: float) -> SignalState:
        if reading.running is None or reading.progress_total is None:
            return SignalState(
                rule.name, False, None, rule.raise_to, "no running-requests gauge or generated-token counter"
            )
        if not reading.running or self.progress_at is None:
            return SignalState(rule.name, False, 0.0, rule.raise_to, "no request running")
        stalled = now - self.progress_at
        return SignalState(
            rule.name,
            stalled >= rule.seconds,
            stalled,
            rule.raise_to,
            f"{reading.running:g} requests running, no token generated for {stalled:.1f} s; alert at {rule.seconds:g} s",
        )

    def _hit_rate(self, rule: SignalRule, now: float) -> SignalState:
        hits, queries = self._window(rule, now, "prefix_hits_total"), self._window(rule, now, "prefix_queries_total")
        if len(hits) < 2 or len(queries) < 2:
            return SignalState(rule.name, False, None, rule.raise_to, "needs two readings of the prefix-cache counters")
        asked = increase(queries)
        if asked == 0:
            return SignalState(
                rule.name, False, None, rule.raise_to, f"no prefix-cache queries within {rule.window_seconds:g} s"
            )
        rate = increase(hits) / asked
        return SignalState(
            rule.name,
            rate < rule.below,
            rate,
            rule.raise_to,
            f"prefix-cache hit rate {rate:.1%} of {asked:g} queried tokens within {rule.window_seconds:g} s; alert below {rule.below:.0%}",
        )

    def _offload_usage(self, rule: SignalRule, reading: Reading) -> SignalState:
        usage = reading.offload_usage
        if usage is None:
            return SignalState(rule.name, False, None, rule.raise_to, "no host KV tier (--kv-offloading-size unset)")
        return SignalState(
            rule.name,
            usage > rule.above,
            usage,
            rule.raise_to,
            f"transfers pin {usage:.1%} of the host KV tier; alert above {rule.above:.0%}",
        )

    def _offload_latency(self, rule: SignalRule, now: float) -> SignalState:
        seconds = self._window(rule, now, "offload_load_seconds_total")
        loads = self._window(rule, now, "offload_loads_total")
        if len(seconds) < 2 or len(loads) < 2:
            return SignalState(rule.name, False, None, rule.raise_to, "needs two readings of the host tier's loads")
        count = increase(loads)
        if count == 0:
            return SignalState(
                rule.name,
                False,
                None,
                rule.raise_to,
                f"no loads from the host KV tier within {rule.window_seconds:g} s",
            )
        latency = increase(seconds) / count * 1000
        return SignalState(
            rule.name,
            latency > rule.above_ms,
            latency,
            rule.raise_to,
            f"{count:g} loads from the host KV tier averaged {latency:.3g} ms within {rule.window_seconds:g} s; alert above {rule.above_ms:g} ms",
        )


def increase(values: list[float]) -> float:
    """How much a counter grew over successive readings; a drop is a reset, and the new value counts as growth."""
    return sum(b - a if b >= a else b for a, b in itertools.pairwise(values))
