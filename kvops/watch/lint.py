"""`kvops lint`: engine metric names a monitoring file reads that the target release does not export, and PromQL
ranges too short to hold two scrapes.

Any text file is read line by line: Prometheus rule files and PrometheusRules, Grafana dashboards, KEDA
ScaledObjects, HPA and prometheus-adapter configs, production-stack and AIBrix values, even router source. Each
engine's adapter gives its catalogue (`metrics.CATALOGUE`: the families a release exports, those it retired with
their replacement and releases, and names under its prefix another component exports). A retired name is not
reported on a line that also names its replacement: `new or old` reads on both releases.

A range `[D]` shorter than two scrape intervals holds at most one sample: rate(), increase() and delta() return
nothing, so a rule built on it never fires (Grafana's `$__rate_interval` is fine).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

from kvops import engines
from kvops.engines.metrics import Catalogue
from kvops.frozen import frozen

SUFFIXES = (".yaml", ".yml", ".json", ".rules", ".txt", ".prom", ".py", ".jsonnet", ".libsonnet")
# a duration as Prometheus parses it (model/duration.go: units in order, any number of them, `1m30s`); a range,
# or a subquery `[range:step]` (`[range:]`: at the evaluation interval, taken to be the scrape interval)
DURATION = r"(?:\d+(?:ms|s|m|h|d|w|y))+"
RANGE = re.compile(rf"\[({DURATION})(?::({DURATION})?)?\]")
UNIT = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


@frozen
class Finding:
    path: str
    line: int
    name: str  # the metric name, or the range as written
    problem: str  # removed | hidden | deprecated | not exported | misread | range too short | another component's
    message: str
    fails: bool  # counts toward the exit code

    def text(self) -> str:
        return f"{self.path}:{self.line}: {self.name}: {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)


def files(paths: Iterable[Path]) -> Iterator[Path]:
    """The files named, and under each folder named every file with a monitoring-config suffix, sorted."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        else:
            yield path


def lint(paths: Iterable[Path], releases: dict[str, str], scrape_seconds: float) -> list[Finding]:
    """Every finding in these files against each engine's catalogue at `releases[engine]` (default: its own)."""
    catalogues = [engines.get(name).metrics.CATALOGUE for name in engines.NAMES]
    findings: list[Finding] = []
    for path in files(paths):
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            for catalogue in catalogues:
                release = releases.get(catalogue.engine, catalogue.release)
                findings += _names(str(path), number, line, catalogue, release)
            findings += _ranges(str(path), number, line, scrape_seconds)
    return findings


def _names(path: str, number: int, line: str, catalogue: Catalogue, release: str) -> Iterator[Finding]:
    seen = set()
    families = {catalogue.family(name) for name in re.findall(catalogue.pattern, line)}
    for family in sorted(families):
        if family in seen:
            continue
        seen.add(family)
        title = f"{engines.get(catalogue.engine).title} {release}"
        retired = catalogue.retired.get(family)
        if retired is not None:
            state = retired.state(release)
            if state is None or (retired.replacement and retired.replacement.split()[0] in families):
                continue
            steps = ", ".join(
                f"{step} in {since}"
                for step, since in (
                    ("deprecated", retired.deprecated),
                    ("hidden", retired.hidden),
                    ("removed", retired.removed),
                )
                if since
            )
            instead = f"use {retired.replacement}" if retired.replacement else "nothing replaces it"
            message = f"{state} in {title} ({steps}: {retired.source}); {instead}"
            yield Finding(path, number, family, state, message, state != "deprecated")
        elif family in catalogue.misread:
            headroom = bool(re.search(r"kv|headroom|cache|block|memory|capacity", line, re.IGNORECASE))
            message = f"{catalogue.misread[family]}{' (this line reads it as KV headroom)' if headroom else ''}"
            yield Finding(path, number, family, "misread", message, headroom)
        elif family in catalogue.others:
            message = f"not an engine metric: {catalogue.others[family]} exports it"
            yield Finding(path, number, family, "another component's", message, False)
        elif family not in catalogue.exported:
            message = f"{title} exports no such metric"
            yield Finding(path, number, family, "not exported", message, True)


def _ranges(path: str, number: int, line: str, scrape_seconds: float) -> Iterator[Finding]:
    for match in RANGE.finditer(line):
        # a subquery with its own step holds a point per step, whatever the scrape interval
        step = _seconds(match.group(2)) if match.group(2) else scrape_seconds
        if _seconds(match.group(1)) < 2 * step:
            at = f"its {step:g} s step" if match.group(2) else f"a {scrape_seconds:g} s scrape interval"
            message = (
                f"holds fewer than 2 samples at {at}: rate(), increase() and "
                f"delta() return nothing, so what is built on it never fires; use at least [{4 * step:g}s]"
            )
            yield Finding(path, number, match.group(0), "range too short", message, True)


def _seconds(duration: str) -> float:
    return sum(int(count) * SECONDS[unit] for count, unit in UNIT.findall(duration))
