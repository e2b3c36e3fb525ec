"""What an engine's metrics say about KV pressure, engine-neutral: `Samples` in, one `Reading` out.

Each engine's `metrics.py` turns the samples of one replica (a /metrics scrape, or that replica's series in a
Prometheus query) into a `Reading`, or raises `MetricsError` naming what is wrong with them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import NamedTuple

from kvops.frozen import frozen


class MetricsError(Exception):
    """Metrics that cannot be used: missing, renamed, NaN, unparseable. The message says which and why."""


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


class Samples:
    """Samples indexed by name. A counter is found under its name with or without `_total`.

    prometheus_client's parser names counter samples `<family>_total` even when the exposition does not (TGI's
    Rust exporter writes `tgi_request_count 5`), while Prometheus keeps the name as scraped: looking up both
    spellings makes one engine parser serve both sources.
    """

    def __init__(self, samples: Iterable[Sample], seen: Iterable[str] = ()):
        self._by_name: dict[str, list[Sample]] = defaultdict(list)
        for sample in samples:
            self._by_name[sample.name].append(sample)
        self.seen = set(seen) | set(self._by_name)  # every metric name in the source, parsed or skipped

    @classmethod
    def from_exposition(cls, text: str, only: Iterable[str] | None = None) -> Samples:
        """Parse the Prometheus text format with prometheus_client's parser.

        With `only` (metric names), the lines of other metrics are skipped before parsing: an engine's /metrics is
        mostly histograms the watcher does not read, and skipping them cuts a poll's CPU about tenfold
        (bench/watch_poll.py). A body with none of those metrics is parsed whole, so garbage is still called garbage.
        """
        from prometheus_client.parser import text_string_to_metric_families

        seen: set[str] = set()
        if only is not None:
            text, seen = _select(text, tuple(only))
        try:
            return cls(
                (
                    Sample(s.name, dict(s.labels), float(s.value))
                    for family in text_string_to_metric_families(text)
                    for s in family.samples
                ),
                seen,
            )
        except (ValueError, TypeError, IndexError) as exc:
            raise MetricsError(f"not the Prometheus text format ({_short(exc)})") from None

    def __len__(self) -> int:
        return sum(len(samples) for samples in self._by_name.values())

    def series(self, name: str, **labels: str) -> list[Sample]:
        found = self._by_name.get(name, []) + self._by_name.get(name + "_total", [])
        return [s for s in found if all(s.labels.get(key) == value for key, value in labels.items())]

    def total(self, name: str, **labels: str) -> float | None:
        """The sum over the series of a counter or gauge (data-parallel engines export one per engine); None if absent."""
        found = self.series(name, **labels)
        return _finite(name, sum(s.value for s in found)) if found else None

    def highest(self, name: str) -> float | None:
        found = self.series(name)
        return _finite(name, max(s.value for s in found)) if found else None


@frozen
class Reading:
    """One replica at one instant: KV usage and the saturation counters, engine-neutral."""

    kv_usage: float  # 0-1
    basis: (
        str  # how kv_usage was obtained, e.g. "vllm:kv_cache_usage_perc" or "tgi_batch_current_max_tokens 8192 / 16000"
    )
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None  # a counter; None where the engine never preempts (TGI)
    progress_total: float | None = None  # a counter that grows while tokens are generated
    prefix_hits_total: float | None = None
    prefix_queries_total: float | None = None
    capacity_tokens: int | None = None  # the replica's KV pool (every data-parallel engine's)
    block_size: int | None = None
    usable_tokens: int | None = None  # the tokens kv_usage is a fraction of
    used_tokens: float | None = None  # KV tokens in use (or reserved) now: kv_usage x usable_tokens
    max_model_len: int | None = None
    waiting_for_capacity: float | None = None  # waiting requests held back for KV or batch room (vLLM)
    offload_usage: float | None = None  # the host (CPU) KV tier: the share pinned by transfers, 0-1
    offload_load_seconds_total: float | None = None  # counters: time spent and loads from the host tier to the GPU
    offload_loads_total: float | None = None
    offload_load_bytes_total: float | None = None
    admission_rejections_total: float | None = None  # a counter: requests the engine's own queue limit refused (503)
    offload_capacity_tokens: int | None = None  # the host KV tier's tokens, as the engine exports them
    cached_tokens_by_source: Mapping[str, float] | None = None  # counters: prefix-cache hit tokens per cache tier

    def to_dict(self) -> dict:
        counts = (
            "running",
            "waiting",
            "preemptions_total",
            "progress_total",
            "prefix_hits_total",
            "prefix_queries_total",
            "used_tokens",
            "waiting_for_capacity",
            "offload_loads_total",
            "offload_load_bytes_total",
            "admission_rejections_total",
        )
        return {
            "kv_usage": self.kv_usage,
            "basis": self.basis,
            **{name: exact(getattr(self, name)) for name in counts},
            "capacity_tokens": self.capacity_tokens,
            "usable_tokens": self.usable_tokens,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "offload_usage": self.offload_usage,
            "offload_capacity_tokens": self.offload_capacity_tokens,
            "cached_tokens_by_source": (
                {name: exact(value) for name, value in self.cached_tokens_by_source.items()}
                if self.cached_tokens_by_source is not None
                else None
            ),
            "offload_load_seconds_total": self.offload_load_seconds_total,
        }


def exact(value: float | None) -> float | int | None:
    """A count as an integer when it is one (Prometheus exports every value as a float)."""
    return int(value) if value is not None and float(value).is_integer() else value


def _select(text: str, names: tuple[str, ...]) -> tuple[str, set[str]]:
    """The lines (samples, HELP, TYPE) of metrics whose name starts with one of `names`, and every name seen."""
    kept: list[str] = []
    seen: set[str] = set()
    samples = 0
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(names):
                kept.append(line)
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0].strip()
        if name:
            seen.add(name)
        if name and name.startswith(names):
            kept.append(line)
            samples += 1
    return ("\n".join(kept) + "\n", seen) if samples else (text, seen)


def usage_fraction(name: str, value: float) -> float:
    """A 0-1 usage, or MetricsError: NaN and values outside [0, 1] mean the input is broken, not that KV is full."""
    if math.isnan(value):
        raise MetricsError(f"{name} is NaN")
    if not 0.0 <= value <= 1.0:
        raise MetricsError(f"{name} is {value:g}, outside 0-1")
    return value


MAX_SAMPLE = 1e18  # no engine counts more requests, tokens or bytes; larger finite values (1e306) are garbage


def _finite(name: str, value: float) -> float:
    """A usable count or gauge. Beyond NaN and Inf, a finite value past MAX_SAMPLE is refused too: multiplied by a
    request's tokens it would overflow to Inf (and round() of Inf raises), so it counts as missing data."""
    if math.isnan(value):
        raise MetricsError(f"{name} is NaN")
    if math.isinf(value):
        raise MetricsError(f"{name} is {'+' if value > 0 else '-'}Inf")
    if abs(value) > MAX_SAMPLE:
        raise MetricsError(f"{name} is {value:g}, past {MAX_SAMPLE:g}: not a real count")
    return value


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


# --- PromQL --------------------------------------------------------------------------------------------

_MATCHER = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


def selector_matchers(selector: str | None) -> list[str]:
    """'{job="vllm", namespace=~"llm-.*"}' -> ['job="vllm"', 'namespace=~"llm-.*"']; ValueError when malformed."""
    if not selector or not selector.strip():
        return []
    text = selector.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"{selector!r} is not a label selector; write it like '{{job=\"vllm\"}}'")
    inner = text[1:-1].strip().rstrip(",")
    matchers: list[str] = []
    position = 0
    while position < len(inner):
        found = _MATCHER.match(inner, position)
        if not found:
            raise ValueError(f"{selector!r} is not a label selector; write it like '{{job=\"vllm\"}}'")
        if found.group(0).strip().startswith("__name__"):
            raise ValueError(
                f"{selector!r} names a metric (__name__); a selector here selects the engine's series by label"
            )
        matchers.append(found.group(0).strip())
        position = found.end()
        if position < len(inner):
            if inner[position] != ",":
                raise ValueError(f"{selector!r} is not a label selector; write it like '{{job=\"vllm\"}}'")
            position += 1
    return matchers


def series(name: str, matchers: list[str], **labels: str) -> str:
    """A PromQL series selector: series('x', ['job="vllm"'], method='decode') -> 'x{job="vllm",method="decode"}'."""
    every = matchers + [f'{key}="{value}"' for key, value in labels.items()]
    return f"{name}{{{','.join(every)}}}" if every else name


@frozen
class PromQL:
    """An engine's saturation signals as PromQL, for the alert rules. `$window` stands for a range like 60s."""

    usage: str  # 0-1 per series
    up: str
    running: str
    waiting: str
    progress_increase: str  # tokens (or decode steps) generated within $window
    preemptions_increase: str | None = None
    prefix_hits_increase: str | None = None
    prefix_queries_increase: str | None = None
    offload_usage: str | None = None  # the host KV tier, 0-1
    offload_load_seconds_increase: str | None = None  # seconds spent loading from the host tier within $window
    offload_loads_increase: str | None = None  # loads from the host tier within $window
    refusals_increase: str | None = None  # requests the engine's own queue limit refused within $window
    matchers: tuple[str, ...] = ()  # the selector every series above carries: rules read their recorded series by it

    @staticmethod
    def window(template: str, seconds: float) -> str:
        return template.replace("$window", duration(seconds))


def duration(seconds: float) -> str:
    """A Prometheus duration: 30s, 5m, 90s."""
    whole = round(seconds)
    return f"{whole // 60}m" if whole and whole % 60 == 0 else f"{whole}s"


# --- what a release exports, for `kvops lint` --------------------------------------------------------------


def release_key(release: str) -> tuple[int, ...]:
    """'0.32' -> (0, 32): releases compare by their numbers."""
    return tuple(int(part) for part in release.split("."))


@frozen
class Retired:
    """A metric the engine stopped exporting, or will: its replacement and the releases of each step."""

    replacement: str | None  # None: nothing replaces it
    deprecated: str
    hidden: str | None  # still exported on request (vLLM's --show-hidden-metrics-for-version)
    removed: str | None
    source: str  # the upstream change that says so

    def state(self, release: str) -> str | None:
        """'removed', 'hidden', 'deprecated' at `release`, or None before its deprecation."""
        at = release_key(release)
        for state, since in (("removed", self.removed), ("hidden", self.hidden), ("deprecated", self.deprecated)):
            if since is not None and at >= release_key(since):
                return state
        return None


@frozen
class Catalogue:
    """An engine's metric families (names as registered, without `_total`/`_bucket`/... suffixes) at a release."""

    engine: str
    release: str
    pattern: str  # a regex that finds the engine's metric names in any text
    exported: frozenset[str]
    retired: Mapping[str, Retired]
    others: Mapping[str, str]  # names with the engine's prefix another component exports: name -> who
    # exported names that are not what their name suggests to a monitoring author: name -> what they count instead
    misread: Mapping[str, str] = field(default_factory=dict)

    SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")

    def family(self, name: str) -> str:
        """The family a sample name belongs to (vllm:num_preemptions_total -> vllm:num_preemptions)."""
        for suffix in self.SUFFIXES:
            base = name.removesuffix(suffix)
            if base != name and self.known(base) and not self.known(name):
                return base
        return name

    def known(self, name: str) -> bool:
        return name in self.exported or name in self.retired or name in self.others
