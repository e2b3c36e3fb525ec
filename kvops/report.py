"""`kvops report`: a `kvops watch --record` CSV as a summary and a plot of usage over time.

The plot shades the policy's bands (ok, warn, degrade, critical), draws each replica's KV usage, and marks
every level change with a vertical line labelled with the level entered.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvops.errors import UsageError
from kvops.policy import GRADED, Level, Policy
from kvops.watch.record import COLUMNS

BAND_COLOURS = {Level.OK: "#e8f5e9", Level.WARN: "#fff8e1", Level.DEGRADE: "#ffe0b2", Level.CRITICAL: "#ffcdd2"}
LEVEL_COLOURS = {"ok": "#2e7d32", "warn": "#f9a825", "degrade": "#ef6c00", "critical": "#c62828", "unknown": "#616161"}


@dataclass(frozen=True)
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


def plot(frame, policy: Policy, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 4.5), dpi=120)
    edges = [0.0] + [policy.thresholds[level] * 100 for level in GRADED] + [100.0]
    for level, low, high in zip((Level.OK, *GRADED), edges, edges[1:]):
        axes.axhspan(low, high, color=BAND_COLOURS[level], zorder=0)
        axes.text(1.005, (low + high) / 2, level.label, transform=axes.get_yaxis_transform(), va="center", fontsize=8)
    for replica, rows in frame.groupby("replica", sort=True):
        rows = rows.sort_values("time")
        axes.plot(
            rows["seconds"],
            rows["kv_usage"] * 100,
            marker=".",
            markersize=3,
            linewidth=1.2,
            label=str(replica),
            zorder=3,
        )
        for at, before, after in zip(rows["seconds"], rows["level"].shift(), rows["level"]):
            if isinstance(before, str) and before != after:
                axes.axvline(at, color=LEVEL_COLOURS.get(after, "black"), linestyle="--", linewidth=0.8, zorder=2)
                axes.text(
                    at,
                    101,
                    after,
                    rotation=90,
                    va="bottom",
                    ha="center",
                    fontsize=7,
                    color=LEVEL_COLOURS.get(after, "black"),
                )
    axes.set_ylim(0, 100)
    axes.set_xlim(left=0)
    axes.set_xlabel("seconds since the first poll")
    axes.set_ylabel("KV-cache usage (%)")
    axes.set_title(title, fontsize=10, pad=28)
    if frame["replica"].nunique() > 1:
        axes.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
