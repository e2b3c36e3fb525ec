"""Defects left by an earlier session in `kvops watch` and what reads its output; each test replays one."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.extras import needs
from tests.support.metrics_server import MetricsServer, vllm_exposition
from tests.support.processes import REPO, checkout_env

LEGACY_HEADER = (
    "time,replica,level,kv_usage,running,waiting,preemptions_total,progress_total,signals,fleet_level,error\n"
)


def _watch_until(server: MetricsServer, record: Path, rows: int) -> None:
    """`kvops watch --record` in a process of its own, stopped with SIGTERM once `record` holds `rows` rows."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "kvops", "watch", "--engine", "vllm", "--metrics-url", server.url]
        + ["--interval", "0.2", "--record", str(record)],
        cwd=REPO,
        env=checkout_env(),
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while _rows(record) < rows and time.monotonic() < deadline:
            time.sleep(0.05)
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=30) == 0
    finally:
        watch.kill()


def _rows(path: Path) -> int:
    return max(path.read_text().count("\n") - 1, 0) if path.exists() else 0


@needs("pandas")
def test_report_counts_no_time_while_the_watcher_was_not_running(tmp_path, run_kvops):
    """A watcher restarted onto its own --record: report credited the gap to the level of the last row before it
    (ok at 1000 and 1001, warn at 5000 and 5001: `ok 4000 s`). Each row now names its run (its first poll's time
    and the poll interval), and no time is counted across a run's start."""
    record = tmp_path / "watch.csv"
    with MetricsServer(vllm_exposition(0.1)) as server:
        _watch_until(server, record, 3)
        time.sleep(2.0)  # the watcher is down
        server.set(vllm_exposition(0.8))
        _watch_until(server, record, 6)
    with record.open(newline="") as file:
        rows = list(csv.DictReader(file))
    runs = sorted({row["run_started"] for row in rows})
    assert len(runs) == 2 and {row["interval"] for row in rows} == {"0.2"}
    assert all(
        row["run_started"] == min(r["time"] for r in rows if r["run_started"] == row["run_started"]) for row in rows
    )
    first = [float(r["time"]) for r in rows if r["run_started"] == runs[0]]
    second = [float(r["time"]) for r in rows if r["run_started"] == runs[1]]
    summary = json.loads(run_kvops("report", str(record), "--json").stdout)["replicas"][0]
    assert summary["seconds_in_level"] == {
        "ok": round(max(first) - min(first), 3),
        "warn": round(max(second) - min(second), 3),
    }
    assert summary["runs"] == 2 and summary["unwatched_seconds"] == round(min(second) - max(first), 3) >= 2.0
    assert [(c["from"], c["to"]) for c in summary["level_changes"]] == [("ok", "warn")]
    text = run_kvops("report", str(record)).stdout
    assert f"not watched: {summary['unwatched_seconds']:g} s between 2 runs" in text


@needs("pandas")
def test_report_reads_the_example_record_without_the_gap(tmp_path, run_kvops):
    """The brief's record, with its runs named: ok 1 s and warn 1 s, not ok 4000 s."""
    path = tmp_path / "record.csv"
    header = LEGACY_HEADER.strip() + ",run_started,interval\n"
    path.write_text(
        header
        + "".join(
            f"{t}.000,a:1,{level},{usage},1,0,0,10,,{level},,{run}.000,1\n"
            for t, level, usage, run in ((1000, "ok", 0.1, 1000), (1001, "ok", 0.1, 1000))
            + ((5000, "warn", 0.8, 5000), (5001, "warn", 0.8, 5000))
        )
    )
    assert run_kvops("report", str(path)).stdout.splitlines()[:3] == [
        "a:1: 4 polls (0 unknown), peak KV usage 80.0%",
        "  time in level: ok 1 s, warn 1 s",
        "  not watched: 3999 s between 2 runs (counted in no level)",
    ]


@needs("pandas")
def test_a_record_without_run_columns_still_reads_and_keeps_its_columns(tmp_path, run_kvops):
    """A record begun by a kvops without the run columns: report reads it as one run, as before, and a watcher
    appending to it keeps its eleven columns (a CSV of two widths would be unreadable to pandas)."""
    import pandas

    path = tmp_path / "old.csv"
    path.write_text(LEGACY_HEADER + "1000.000,a:1,ok,0.1,1,0,0,10,,ok,\n1010.000,a:1,warn,0.8,1,0,0,20,,warn,\n")
    summary = json.loads(run_kvops("report", str(path), "--json").stdout)["replicas"][0]
    assert summary["seconds_in_level"] == {"ok": 10.0, "warn": 0.0} and summary["runs"] == 1
    with MetricsServer(vllm_exposition(0.1)) as server:
        run_kvops("watch", "--engine", "vllm", "--metrics-url", server.url, "--once", "--record", str(path))
    assert pandas.read_csv(path).shape == (3, 11)
    assert path.read_text().splitlines()[-1].count(",") == 10


@needs("pandas")
def test_a_new_record_reads_by_name_and_position_as_before(tmp_path, run_kvops):
    """The run columns come last: a reader of the eleven columns by name (pandas) or position reads them as
    before; `--once` records a run of one poll (no interval), which counts no time."""
    import pandas

    path = tmp_path / "new.csv"
    with MetricsServer(vllm_exposition(0.3)) as server:
        for _ in range(2):
            run_kvops("watch", "--engine", "vllm", "--metrics-url", server.url, "--once", "--record", str(path))
    frame = pandas.read_csv(path)
    assert list(frame.columns[:11]) == LEGACY_HEADER.strip().split(",")
    assert list(frame.columns[11:]) == ["run_started", "interval"] and frame["interval"].isna().all()
    assert (frame["kv_usage"] == 0.3).all() and (frame["level"] == "ok").all()
    summary = json.loads(run_kvops("report", str(path), "--json").stdout)["replicas"][0]
    assert summary["runs"] == 2 and summary["seconds_in_level"] == {"ok": 0.0}
