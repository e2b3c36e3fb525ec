"""The alerts kvops raises, one catalogue for both ends: the watcher's webhook and `kvops alerts` rule files.

The webhook speaks Alertmanager's API: a JSON list of alerts POSTed to /api/v2/alerts, each with `labels`
(alertname, severity, ...), `annotations` (summary, description, runbook_url), `startsAt`, and `endsAt` once
resolved. Firing alerts are re-sent every `resend_seconds` (Alertmanager resolves an alert it has not heard of
for its resolve_timeout); an alert that could not be delivered stays in the outbox until it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from kvops import engines
from kvops.engines.metrics import duration
from kvops.frozen import frozen
from kvops.policy import GRADED, Level, Policy, SignalRule

LEVEL_ALERTS = {Level.WARN: "KVCacheWarn", Level.DEGRADE: "KVCacheDegrade", Level.CRITICAL: "KVCacheCritical"}
SIGNAL_ALERTS = {
    "queue_growth": "EngineQueueGrowing",
    "preemptions": "EnginePreempting",
    "stall": "EngineStalled",
    "prefix_cache_hit_rate": "PrefixCacheHitRateLow",
    "offload_usage": "KVOffloadSaturated",
    "offload_load_latency": "KVOffloadLoadSlow",
}
GPU_MEMORY_ALERT = "GPUMemoryHigh"
STALE_ALERT = "KVMetricsStale"
REFUSAL_ALERT = "EngineRefusingRequests"  # the engine's own queue limit answered requests 503 (vLLM 0.32+)
REFUSAL_WINDOW = 300.0  # seconds
SEVERITY = {Level.WARN: "warning", Level.DEGRADE: "warning", Level.CRITICAL: "critical", None: "info"}


@frozen
class AlertKind:
    """One alert: its name, severity, what kind of number `{value}` is, and the text around it."""

    name: str
    severity: str
    unit: str  # ratio | count | ms | text: how a value is printed
    summary: str  # may use {where}
    description: str  # may use {where} and {value}

    def runbook_url(self, base: str) -> str:
        return f"{base.rstrip('/')}/{self.name.lower()}.md"

    def annotations(self, where: str, value: str, runbook_base: str) -> dict[str, str]:
        return {
            "summary": self.summary.format(where=where),
            "description": self.description.format(where=where, value=value),
            "runbook_url": self.runbook_url(runbook_base),
        }


def catalogue(policy: Policy, engine: str) -> list[AlertKind]:
    """Every alert the policy defines for an engine: the three levels, its signals, metrics stale."""
    kinds = [_level_kind(policy, level) for level in GRADED]
    kinds += [_signal_kind(policy.signals[name]) for name in engines.get(engine).signals if name in policy.signals]
    if getattr(engines.get(engine), "refuses_at_queue_limit", False):
        kinds.append(_refusal_kind())
    kinds.append(
        AlertKind(
            STALE_ALERT,
            "warning",
            "text",
            "KV metrics of {where} are stale",
            f"No usable KV metrics from {{where}} for {policy.stale_after_failures} consecutive polls ({{value}}): "
            f"kvops {_unknown_level(policy)} and the request limits are {_unknown_limits(policy)}.",
        )
    )
    return kinds


def _refusal_kind() -> AlertKind:
    """The engine refused requests at its own queue limit (vLLM --max-num-queued-reqs / --max-num-queued-tokens,
    `vllm:admission_rejections`): clients got 503 without Retry-After; not a level, an alert only."""
    return AlertKind(
        REFUSAL_ALERT,
        "warning",
        "count",
        "{where} refuses requests at its queue limit",
        f"{{where}} refused {{value}} requests within {duration(REFUSAL_WINDOW)} at its own queue limit: they got "
        "503 without Retry-After. Put `kvops watch --proxy` in front for 429/503 with Retry-After, or raise the limit.",
    )


def _level_kind(policy: Policy, level: Level) -> AlertKind:
    limits = policy.limits(level)
    effect = f"new requests are {' and '.join(limits.effects())}" if limits.effects() else "no request is changed"
    return AlertKind(
        LEVEL_ALERTS[level],
        SEVERITY[level],
        "ratio",
        f"KV cache of {{where}} is {_percent(policy.thresholds[level])} full or more",
        f"KV cache usage on {{where}} is {{value}} ({level.label} at {_percent(policy.thresholds[level])}): {effect}.",
    )


def _signal_kind(rule: SignalRule) -> AlertKind:
    raises = f" kvops raises the level to {rule.raise_to.label}." if rule.raise_to else ""
    window = duration(rule.window_seconds)
    texts = {
        "queue_growth": (
            "count",
            "Waiting queue of {where} is growing",
            f"The waiting queue of {{where}} grew by {{value}} requests within {window} (alert at {rule.min_growth:g}): admitted requests hold the KV cache.{raises}",
        ),
        "preemptions": (
            "count",
            "{where} is preempting requests",
            f"{{value}} preemptions on {{where}} within {window}: the engine frees KV blocks by evicting running requests and recomputing them later.{raises}",
        ),
        "stall": (
            "count",
            "{where} generates no tokens",
            f"{{value}} requests are running on {{where}} but no token was generated for {duration(rule.seconds)}.{raises}",
        ),
        "prefix_cache_hit_rate": (
            "ratio",
            "Prefix-cache hit rate of {where} is low",
            f"The prefix-cache hit rate of {{where}} is {{value}} over {window} (alert below {_percent(rule.below)}).{raises}",
        ),
        "offload_usage": (
            "ratio",
            "Host KV tier of {where} is saturated",
            f"Transfers pin {{value}} of the host (CPU) KV tier of {{where}} (alert above {_percent(rule.above)}): new offloads may be dropped, and evicted prefixes are recomputed instead of reloaded.{raises}",
        ),
        "offload_load_latency": (
            "ms",
            "Loads from the host KV tier of {where} are slow",
            f"Loads of KV blocks from host memory to {{where}} took {{value}} on average over {window} (target under {rule.above_ms:g} ms).{raises}",
        ),
    }
    unit, summary, description = texts[rule.name]
    return AlertKind(SIGNAL_ALERTS[rule.name], SEVERITY[rule.raise_to], unit, summary, description)


def _unknown_level(policy: Policy) -> str:
    if policy.grace_polls >= policy.stale_after_failures:
        return f"keeps the last level for up to {policy.grace_polls} failed polls, then holds it at unknown"
    return "holds the level at unknown"


def _unknown_limits(policy: Policy) -> str:
    return (
        "those of the last known level (fail-closed)" if policy.unknown_mode == "fail-closed" else "lifted (fail-open)"
    )


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def format_value(unit: str, value: float | str | None) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, str):
        return value
    if unit == "ms":
        return f"{value:.3g} ms"
    return f"{value * 100:.1f}%" if unit == "ratio" else f"{value:g}"


def gpu_memory_kind(policy: Policy, kv_usage: float, threshold: float | None = None) -> AlertKind:
    """The GPU-memory target as an alert: from a plan, memory in use (weights, overheads and the KV blocks in use)
    reaches `threshold` of the device (the policy's `gpu_memory.below`, or more where that falls below the warn
    level) when KV usage reaches `kv_usage`."""
    target = _percent(policy.gpu_memory_below)
    at = f"{threshold:.1%}" if threshold is not None and threshold > policy.gpu_memory_below else target
    where_from = (
        f"target under {target}, reached at {kv_usage:.1%} KV usage"
        if at == target
        else f"the {target} target is passed below the warn level, so this alerts where KV usage reaches {kv_usage:.0%}"
    )
    return AlertKind(
        GPU_MEMORY_ALERT,
        "warning",
        "ratio",
        f"GPU memory in use on {{where}} is {at} of the device or more",
        f"Memory in use on {{where}} (the plan's weights and overheads, and the KV blocks in use) is {{value}} of the device ({where_from}).",
    )


# --- the webhook: Alertmanager's alert format ------------------------------------------------------------


@dataclass
class Alert:
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None = None
    generator_url: str | None = None

    @property
    def key(self) -> tuple:
        return tuple(sorted(self.labels.items()))

    @property
    def status(self) -> str:
        return "resolved" if self.ends_at is not None else "firing"

    def payload(self) -> dict:
        body = {"labels": self.labels, "annotations": self.annotations, "startsAt": rfc3339(self.starts_at)}
        if self.ends_at is not None:
            body["endsAt"] = rfc3339(self.ends_at)
        if self.generator_url:
            body["generatorURL"] = self.generator_url
        return body


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class AlertBook:
    """The alerts firing now, and those still to be delivered to the webhook."""

    resend_seconds: float = 60.0
    firing: dict[tuple, Alert] = field(default_factory=dict)
    outbox: dict[tuple, Alert] = field(default_factory=dict)
    last_sent: float | None = None

    def reconcile(self, desired: list[Alert], now: float) -> list[Alert]:
        """Make `desired` the firing set; returns the alerts that started or were resolved."""
        changes: list[Alert] = []
        wanted = {alert.key: alert for alert in desired}
        for key, alert in wanted.items():
            if key in self.firing:
                self.firing[key].annotations = alert.annotations
            else:
                self.firing[key] = replace(alert, starts_at=now)
                self.outbox[key] = replace(
                    self.firing[key]
                )  # a copy: later annotation updates must not rewrite what is queued
                changes.append(self.firing[key])
        for key in [key for key in self.firing if key not in wanted]:
            resolved = replace(self.firing.pop(key), ends_at=now)
            self.outbox[key] = resolved
            changes.append(resolved)
        if self.firing and (self.last_sent is None or now - self.last_sent >= self.resend_seconds):
            for key, alert in self.firing.items():
                self.outbox.setdefault(key, replace(alert))
        return changes

    def take(self) -> list[Alert]:
        """The alerts to send now (they leave the outbox; `restore` puts them back if delivery fails)."""
        sending = list(self.outbox.values())
        self.outbox.clear()
        return sending

    def delivered(self, now: float) -> None:
        self.last_sent = now

    def restore(self, alerts: list[Alert]) -> None:
        for alert in alerts:
            self.outbox.setdefault(alert.key, alert)
