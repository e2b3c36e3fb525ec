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


def _once_prometheus(url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvops", "watch", "--engine", "vllm", "--prometheus", url, "--once", "--timeout", "20"],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_prometheus_given_an_engines_metrics_is_a_bad_option():
    """`--prometheus http://engine:8000/metrics --once`: `unknown`, exit 3 (the engine's level unknown), with
    "JSONDecodeError: Expecting value". Now one line, the exit code of a bad option (4 with --once)."""
    with MetricsServer(vllm_exposition(0.5)) as engine:
        base = f"http://{engine.target}"
        for url, hint in ((engine.url, "; an engine's /metrics is --metrics-url"), (base, "")):
            ran = _once_prometheus(url)
            assert (ran.returncode, ran.stdout) == (4, "")
            assert ran.stderr == (
                f"kvops: error: --prometheus {url} is not Prometheus' base URL ({url}/api/v1/query answered a body "
                f"that is not a Prometheus query result): give the server's base URL, e.g. http://prometheus:9090{hint}\n"
            )


def test_prometheus_given_its_query_path_names_the_base_url():
    """`--prometheus http://prometheus:9090/api/v1/query --once`: "HTTP Status Code 404", exit 3; now the base URL
    to give, exit 4. (A stand-in answering 404 as Prometheus does to an unknown path; the real one is in
    tests/engine/test_alerting_end_to_end.py.)"""
    with MetricsServer("404 page not found\n") as server:
        server.set(status=404)
        base = f"http://{server.target}/prom"
        ran = _once_prometheus(base + "/api/v1/query")
    assert ran.returncode == 4 and ran.stderr == (
        f"kvops: error: --prometheus {base}/api/v1/query is not Prometheus' base URL ({base}/api/v1/query/api/v1/query "
        f"answered 404): give the server's base URL, {base}\n"
    )


def test_prometheus_refused_is_still_an_unknown_engine():
    """Nothing listening at the URL is missing data (exit 3), not a bad option: only an answer proves it wrong."""
    from tests.support.vllm_server import free_port

    port = free_port()  # opened and closed: nothing listens there now
    ran = _once_prometheus(f"http://127.0.0.1:{port}")
    assert ran.returncode == 3 and "cannot query Prometheus" in ran.stdout and ran.stderr == ""


def test_a_running_watcher_given_a_wrong_prometheus_url_exits_before_listening():
    """Without --once a wrong --prometheus URL exits as a bad option does (2, one line) after the first poll,
    before listening; a Prometheus that answered once and then 404s is missing data, the watcher goes on."""
    from tests.support.vllm_server import free_port
    from tests.support.watch_process import WatchProcess

    with MetricsServer(vllm_exposition(0.5)) as engine:
        ran = subprocess.run(
            [sys.executable, "-m", "kvops", "watch", "--engine", "vllm", "--prometheus", engine.url]
            + ["--listen", f"127.0.0.1:{free_port()}", "--timeout", "20"],
            cwd=REPO,
            env=checkout_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert ran.returncode == 2 and ran.stderr.startswith(f"kvops: error: --prometheus {engine.url} is not")
    assert '"event": "started"' not in ran.stdout
    answer = {"status": "success", "data": {"resultType": "vector", "result": [_kv_row(0.5)]}}
    prometheus = MetricsServer("", routes={"/api/v1/query": json.dumps(answer)})
    arguments = ("--engine", "vllm", "--prometheus", f"http://{prometheus.target}", "--interval", "0.2")
    with prometheus, WatchProcess(*arguments) as watch:
        prometheus.set(status=404)
        failed = watch.wait_event(lambda e: e["event"] == "poll_failed", timeout=60)
        assert watch.process.poll() is None
    assert "/api/v1/query answered 404" in failed["error"]


def _kv_row(usage: float) -> dict:
    labels = {"__name__": "vllm:kv_cache_usage_perc", "instance": "a:8000", "job": "vllm", "engine": "0"}
    return {"metric": labels, "value": [1.7e9, str(usage)]}
