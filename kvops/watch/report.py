"""`kvops report`: a `kvops watch --record` CSV read back, summarised per replica (time in each level, level
changes, peak usage); `kvops.render.plots.plot_report` draws it."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.policy import Level
from kvops.watch.record import COLUMNS

LEVELS = [level.label for level in Level]


@frozen
class ReplicaSummary:
    replica: str
    polls: int
    unknown_polls: int
    max_kv_usage: float | None
    seconds_in_level: dict[str, float]
    level_changes: list[tuple[float, str, str]]  # (seconds from start, from, to)

    def to_dict(self) -> dict:
        return {
            "replica": self.replica,
            "polls": self.polls,
            "unknown_polls": self.unknown_polls,
            "max_kv_usage": self.max_kv_usage,
            "seconds_in_level": self.seconds_in_level,
            "level_changes": [{"at_seconds": at, "from": a, "to": b} for at, a, b in self.level_changes],
        }


def load(path: str | Path):
    """The record as a frame; UsageError naming the first line that is not one the watcher writes. A last line
    cut short without its newline (a watcher killed mid-write) is left out."""
    import pandas as pd

    frame = pd.DataFrame(_rows(path), columns=COLUMNS)
    frame["seconds"] = frame["time"] - frame["time"].min()
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
    if not lines or lines[0] != COLUMNS:
        raise UsageError(f"{path}: not a kvops watch --record CSV (columns: {','.join(COLUMNS)})")
    if not text.endswith("\n") and len(lines) > 1:
        lines.pop()  # cut short mid-write
    rows = [_row(path, number, line) for number, line in enumerate(lines[1:], start=2) if line]
    if not rows:
        raise UsageError(f"{path}: no rows yet")
    return rows


def _row(path: str | Path, number: int, line: list[str]) -> list:
    """One record row with its numbers read; UsageError naming the line and the field that is not the watcher's."""
    where = f"{path}:{number}"
    if len(line) != len(COLUMNS):
        raise UsageError(f"{where}: {len(line)} fields, a record row has {len(COLUMNS)} ({','.join(COLUMNS)})")
    row: dict[str, object] = dict(zip(COLUMNS, line))
    for column in ("level", "fleet_level"):
        if row[column] not in LEVELS:
            raise UsageError(f"{where}: {column} {row[column]!r} is not one of {', '.join(LEVELS)}")
    row["time"] = _float(where, "time", line[0], required=True)
    row["kv_usage"] = usage = _float(where, "kv_usage", line[3])
    if not 0.0 <= usage <= 1.0 and usage == usage:
        raise UsageError(f"{where}: kv_usage {line[3]!r} is outside 0-1")
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
        durations = rows["time"].shift(-1) - rows["time"]
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
            )
        )
    return summaries
