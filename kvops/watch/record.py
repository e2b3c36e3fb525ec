"""`--record FILE.csv`: one row per poll and replica, flushed as written (a killed watcher loses nothing).

Columns: time (unix seconds), replica, level, kv_usage (0-1, empty while unknown), the saturation readings,
the signals firing (`+`-joined), the fleet's level, the error that made the replica unknown, and the run the row
belongs to: `run_started` (the time of the run's first poll) and its poll `interval` (empty for `--once`). The run
columns come last, so a reader by position or by name reads the eleven before them as it did; a record begun
without them (kvops before they existed) is appended to in its own columns.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from kvops.errors import UsageError
from kvops.files import make_folder
from kvops.policy import Level

LEGACY_COLUMNS = [
    "time",
    "replica",
    "level",
    "kv_usage",
    "running",
    "waiting",
    "preemptions_total",
    "progress_total",
    "signals",
    "fleet_level",
    "error",
]
COLUMNS = LEGACY_COLUMNS + ["run_started", "interval"]


class Recorder:
    """Appends to `path`; each row names its run (`interval` None: a single `--once` poll)."""

    def __init__(self, path: str | Path, interval: float | None = None):
        self.path = Path(path)
        self.interval = interval
        self.run_started: float | None = None
        try:
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            header = COLUMNS
            if not fresh:
                with self.path.open(newline="") as existing:
                    header = next(csv.reader(existing), [])
                if header not in (COLUMNS, LEGACY_COLUMNS):
                    raise UsageError(
                        f"--record {path}: exists with other columns; give a new file (columns: {','.join(COLUMNS)})"
                    )
            make_folder(self.path)
            self.file = self.path.open("a", newline="")
        except OSError as exc:
            raise UsageError(f"--record {path}: cannot write ({exc.strerror or exc})") from None
        self.writer = csv.writer(self.file)
        self.with_runs = header == COLUMNS
        if fresh:
            self.writer.writerow(COLUMNS)
            self.file.flush()

    def write(self, snapshot, replicas: Iterable) -> None:
        if self.run_started is None:
            self.run_started = snapshot.updated_at
        run = [f"{self.run_started:.3f}", _number(self.interval)] if self.with_runs else []
        for replica in replicas:
            reading = replica.reading if replica.level != Level.UNKNOWN else None
            self.writer.writerow(
                [
                    f"{snapshot.updated_at:.3f}",
                    replica.name,
                    replica.level.label,
                    _number(reading.kv_usage if reading else None),
                    _number(reading.running if reading else None),
                    _number(reading.waiting if reading else None),
                    _number(reading.preemptions_total if reading else None),
                    _number(reading.progress_total if reading else None),
                    "+".join(s.name for s in replica.signal_states if s.firing) if reading else "",
                    snapshot.level.label,
                    replica.error or "",
                    *run,
                ]
            )
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"
