"""`kvops report`: a `kvops watch --record` CSV read back, summarised per replica (time in each level, level
changes, peak usage); `kvops.render.plots.plot_report` draws it.

A row's level holds until the next row of the same run: no time is counted across a run's start (a watcher
restarted onto the same record), nor after a run's last row. A record without the run columns is one run."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.policy import Level
from kvops.watch.record import COLUMNS, LEGACY_COLUMNS

LEVELS = [level.label for level in Level]


@frozen
class ReplicaSummary:
    replica: str
    polls: int
    unknown_polls: int
    max_kv_usage: float | None
    seconds_in_level: dict[str, float]
    level_changes: list[tuple[float, str, str]]  # (seconds from start, from, to)
    runs: int = 1
    unwatched_seconds: float = 0.0  # between one run's last row and the next run's first

    def to_dict(self) -> dict:
        return {
            "replica": self.replica,
            "polls": self.polls,
            "unknown_polls": self.unknown_polls,
            "max_kv_usage": self.max_kv_usage,
            "seconds_in_level": self.seconds_in_level,
            "level_changes": [{"at_seconds": at, "from": a, "to": b} for at, a, b in self.level_changes],
            "runs": self.runs,
            "unwatched_seconds": self.unwatched_seconds,
        }


def load(path: str | Path):
    """The record as a frame; UsageError naming the first line that is not one the watcher writes. A last line
    cut short without its newline (a watcher killed mid-write) is left out."""
    import pandas as pd

    frame = pd.DataFrame(_rows(path), columns=COLUMNS)
    frame["seconds"] = frame["time"] - frame["time"].min()
    frame["run"] = frame["run_started"].fillna(-1.0)  # a record without run columns: one run
    return frame


def _rows(path: str | Path) -> list[list]:
    try:
        with open(path, newline="", encoding="utf-8") as file:
            text = file.read()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file (write one with kvops watch --record FILE.csv)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a kvops watch --record CSV ({exc})") from None
    lines = list(csv.reader(io.StringIO(text)))
    if not lines or lines[0] not in (COLUMNS, LEGACY_COLUMNS):
        raise UsageError(f"{path}: not a kvops watch --record CSV (columns: {','.join(COLUMNS)})")
    if not text.endswith("\n") and len(lines) > 1:
        lines.pop()  # cut short mid-write
    header = lines[0]
    rows = [_row(path, number, line, header) for number, line in enumerate(lines[1:], start=2) if line]
    if not rows:
        raise UsageError(f"{path}: no rows yet")
    return rows


def _row(path: str | Path, number: int, line: list[str], header: list[str]) -> list:
    """One record row with its numbers read; UsageError naming the line and the field that is not the watcher's.
    A row of a record without the run columns gets them empty (NaN)."""
    where = f"{path}:{number}"
    if len(line) != len(header):
        raise UsageError(f"{where}: {len(line)} fields, a record row has {len(header)} ({','.join(header)})")
    row: dict[str, object] = dict(zip(COLUMNS, line + [""] * (len(COLUMNS) - len(line))))
    for column in ("level", "fleet_level"):
        if row[column] not in LEVELS:
            raise UsageError(f"{where}: {column} {row[column]!r} is not one of {', '.join(LEVELS)}")
    row["time"] = _float(where, "time", line[0], required=True)
    row["kv_usage"] = usage = _float(where, "kv_usage", line[3])
    if not 0.0 <= usage <= 1.0 and usage == usage:
        raise UsageError(f"{where}: kv_usage {line[3]!r} is outside 0-1")
    row["run_started"] = _float(where, "run_started", str(row["run_started"]))
    row["interval"] = _float(where, "interval", str(row["interval"]))
    return [row[column] for column in COLUMNS]


def _float(where: str, column: str, text: str, required: bool = False) -> float:
    if text == "" and not required:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(f"{where}: {column} {text!r} is not a number{'' if required else ' (or empty)'}")
    return value


def summarise(frame) -> list[ReplicaSummary]:
    summaries = []
    for replica, rows in frame.groupby("replica", sort=True):
        rows = rows.sort_values("time")
        durations = _durations(rows)
        seconds = {
            level.label: round(float(durations[rows["level"] == level.label].sum()), 3)
            for level in Level
            if (rows["level"] == level.label).any()
        }
        changes = [
            (round(float(s), 3), a, b)
            for s, a, b in zip(rows["seconds"], rows["level"].shift(), rows["level"])
            if isinstance(a, str) and a != b
        ]
        usage = rows["kv_usage"].max()
        summaries.append(
            ReplicaSummary(
                str(replica),
                len(rows),
                int((rows["level"] == "unknown").sum()),
                None if usage != usage else float(usage),
                seconds,
                changes,
                runs=rows["run"].nunique(),
                unwatched_seconds=_unwatched(rows),
            )
        )
    return summaries


def _durations(rows):
    """Each row's time to the next row of its run (0 for a run's last row): a level is never credited with the
    time a watcher was not running."""
    by_run = rows.groupby("run", sort=False)["time"]
    return (by_run.shift(-1) - rows["time"]).fillna(0.0)


def _unwatched(rows) -> float:
    """The time between runs (by their first and last rows) that no run covered."""
    spans = rows.groupby("run")["time"].agg(["min", "max"]).sort_values("min")
    covered_until = spans["max"].cummax().shift()
    return round(float((spans["min"] - covered_until).clip(lower=0).sum()), 3)
