"""`kvops report`: a `kvops watch --record` CSV read back, summarised per replica (time in each level, level
changes, peak usage); `kvops.render.plots.plot_report` draws it."""

from __future__ import annotations

from pathlib import Path

from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.policy import Level
from kvops.watch.record import COLUMNS


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
    import pandas as pd

    try:
        frame = pd.read_csv(
            path,
            dtype={"replica": str, "level": str, "signals": str, "fleet_level": str, "error": str},
            keep_default_na=False,
            na_values={"kv_usage": [""]},
        )
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file (write one with kvops watch --record FILE.csv)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a kvops watch --record CSV ({exc})") from None
    if list(frame.columns) != COLUMNS:
        raise UsageError(f"{path}: not a kvops watch --record CSV (columns: {','.join(COLUMNS)})")
    if frame.empty:
        raise UsageError(f"{path}: no rows yet")
    frame["kv_usage"] = pd.to_numeric(frame["kv_usage"], errors="coerce")
    frame["seconds"] = frame["time"] - frame["time"].min()
    return frame


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
