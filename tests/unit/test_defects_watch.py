"""Defects found using `kvops watch` and what reads its output as an SRE would; each test replays one."""

from __future__ import annotations

import pytest

from tests.support.extras import needs

HEADER = "time,replica,level,kv_usage,running,waiting,preemptions_total,progress_total,signals,fleet_level,error\n"
ROWS = "1000.000,a:1,ok,0.1,1,0,0,10,,ok,\n1001.000,a:1,warn,0.8,1,0,0,20,,warn,\n1002.000,a:1,unknown,,,,,,,unknown,boom\n"


@needs("pandas")
@pytest.mark.parametrize(
    "edit, message",
    [
        (("1001.000", "abc"), "record.csv:3: time 'abc' is not a number"),
        (
            (",warn,0.8", ",WARNING,0.8"),
            "record.csv:3: level 'WARNING' is not one of unknown, ok, warn, degrade, critical",
        ),
        (("0.8", "80%"), "record.csv:3: kv_usage '80%' is not a number (or empty)"),
        (("0.8", "80"), "record.csv:3: kv_usage '80' is outside 0-1"),
        ((",1,0,0,20,,warn,", ",1,0,0,20,warn,"), "record.csv:3: 10 fields, a record row has 11"),
    ],
)
def test_report_names_the_line_of_a_hand_edited_record(tmp_path, run_kvops, edit, message):
    """`kvops report` on a record whose time was not a number: a pandas traceback; an unknown level or a usage of
    '80%': a summary that dropped that time or that peak without a word."""
    path = tmp_path / "record.csv"
    path.write_text(HEADER + ROWS.replace(*edit))
    assert run_kvops("report", str(path), expect=2).stderr.startswith(f"kvops: error: {path.parent}/{message}")


@needs("pandas")
@pytest.mark.parametrize("cut", [9, 17])
def test_report_leaves_out_a_last_line_cut_mid_write(tmp_path, run_kvops, cut):
    """A watcher killed mid-row leaves '1001.000,' or '1001.000,a:1,wa': report had counted a level change to ''
    or to a level 'wa' (pandas filled the missing fields)."""
    path = tmp_path / "record.csv"
    path.write_text(HEADER + ROWS[: len(ROWS.splitlines()[0]) + 1 + cut])
    text = run_kvops("report", str(path)).stdout
    assert text.splitlines() == ["a:1: 1 polls (0 unknown), peak KV usage 10.0%", "  time in level: ok 0 s"]


def _row(name: str, value: str, **labels: str) -> dict:
    return {"metric": {"__name__": name, **labels}, "value": [1.7e9, value]}


def test_prometheus_series_of_two_jobs_are_not_summed_into_one_engine():
    """The same engine scraped by two jobs (a ServiceMonitor and a pod-annotation job): `kvops watch --prometheus`
    without --selector read running 6, waiting 4 and a pool of twice its size for an engine running 3."""
    from kvops.watch.sources import PrometheusSource

    source = PrometheusSource("vllm", "http://prometheus:9090", selector=None, replica_label="instance", timeout=1)
    rows = [
        _row(name, value, instance="a:8000", job=job, engine="0", model_name="m")
        for job in ("vllm", "pods")
        for name, value in (("vllm:kv_cache_usage_perc", "0.5"), ("vllm:num_requests_running", "3"))
    ]
    poll = source.group(rows + [_row("vllm:kv_cache_usage_perc", "0.2", instance="b:8000", job="vllm", engine="0")])
    assert poll.failures == {
        "a:8000": "scraped by 2 jobs (pods, vllm), each count would be summed once per job: "
        """give --selector '{job="pods"}'"""
    }
    assert list(poll.readings) == ["b:8000"]


def test_prometheus_series_without_the_replica_label_are_not_one_replica():
    """`--replica-label pod` over series labelled by instance only: every replica was read as one, named
    '(no pod label)', its usage the fleet's highest and its counts the fleet's sums."""
    from kvops.watch.sources import PrometheusSource

    source = PrometheusSource("vllm", "http://prometheus:9090", selector=None, replica_label="pod", timeout=1)
    rows = [
        _row("vllm:kv_cache_usage_perc", usage, instance=instance, job="vllm", engine="0", model_name="m")
        for instance, usage in (("a:8000", "0.5"), ("b:8000", "0.1"))
    ]
    poll = source.group(rows)
    assert poll.readings == {}
    assert poll.failures == {
        "(no pod label)": "series without a pod label (they have engine, instance, job, model_name): "
        "--replica-label names the label that tells replicas apart"
    }


def _lint(run_kvops, tmp_path, text: str, expect: int) -> list[tuple[int, str, str]]:
    import json

    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    ran = run_kvops("lint", "--json", "--scrape-interval", "15", str(rules), expect=expect)
    return [(f["line"], f["name"], f["message"].split(":")[0]) for f in json.loads(ran.stdout)["findings"]]


def test_lint_reads_a_subquery_step_not_the_scrape_interval(run_kvops, tmp_path):
    """`kvops lint` on `max_over_time(rate(x[1m])[20s:5s])` (four points, one per 5 s step) failed it as a range
    of fewer than 2 samples at the 15 s scrape interval, and exited 1."""
    text = "a: max_over_time(rate(vllm:num_preemptions_total[1m])[20s:5s])\nb: max_over_time(up[5s:10s])\n"
    assert _lint(run_kvops, tmp_path, text, expect=1) == [
        (2, "[5s:10s]", "holds fewer than 2 samples at its 10 s step")
    ]


def test_lint_reads_a_range_of_several_units(run_kvops, tmp_path):
    """`rate(x[0m20s])` (20 s at a 15 s scrape: one sample in most windows) passed `kvops lint` unseen: only a
    range of one unit was read; Prometheus takes `1m30s` as well (model/duration.go)."""
    text = "a: rate(vllm:num_preemptions_total[0m20s])\nb: rate(up[1m30s]) + max_over_time(up[1w])\n"
    assert _lint(run_kvops, tmp_path, text, expect=1) == [
        (1, "[0m20s]", "holds fewer than 2 samples at a 15 s scrape interval")
    ]


@pytest.mark.parametrize("first", [True, False])
def test_sigterm_mid_poll_stops_at_once_with_every_finished_poll_recorded(tmp_path, first):
    """SIGTERM while a poll waited on a hanging /metrics: `kvops watch --timeout 20` exited only once the poll had
    timed out, 20 s later (past a pod's grace period: SIGKILL, no `stopped` event)."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from tests.support.metrics_server import MetricsServer, vllm_exposition
    from tests.support.processes import REPO, checkout_env

    record = tmp_path / "record.csv"
    with MetricsServer(vllm_exposition(0.5)) as server:
        server.set(vllm_exposition(0.5), delay=30 if first else 0)
        watch = subprocess.Popen(
            [sys.executable, "-m", "kvops", "watch", "--engine", "vllm", "--metrics-url", server.url]
            + ["--timeout", "20", "--interval", "0.2", "--record", str(record)],
            cwd=REPO,
            env=checkout_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while (server.hits < 1 if first else _lines(record) < 3) and time.monotonic() < deadline:
                time.sleep(0.05)
            server.set(vllm_exposition(0.5), delay=30)
            time.sleep(1.0)  # a poll is waiting on the hang
            sent = time.monotonic()
            watch.send_signal(signal.SIGTERM)
            assert watch.wait(timeout=15) == 0
            assert time.monotonic() - sent < 5
        finally:
            watch.kill()
        events = [json.loads(line)["event"] for line in watch.stdout.read().splitlines()]
    assert events[-1] == "stopped" and ("started" in events) is not first
    rows = record.read_text().splitlines()
    assert rows[0].startswith("time,replica") and all(row.split(",")[9:11] == ["ok", ""] for row in rows[1:])


def _lines(path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def test_a_replica_never_read_does_not_change_from_ok_to_unknown(tmp_path):
    """`kvops watch` started beside a dead /metrics logged `level_changed` from ok to unknown (severity error) and
    counted a change into unknown on /kvops/metrics, for a replica it had never read as ok."""
    import asyncio
    import io
    import json

    from kvops.policy import load_policy
    from kvops.watch.sources import ScrapeSource
    from kvops.watch.watcher import EventLog, Watcher
    from tests.support.metrics_server import MetricsServer

    with MetricsServer() as server:
        url = server.url
    log = io.StringIO()
    watcher = Watcher(load_policy(None), "vllm", ScrapeSource("vllm", url, timeout=1), log=EventLog(log))

    async def poll_once():
        try:
            return await watcher.poll()
        finally:
            await watcher.close()

    assert asyncio.run(poll_once()).level.label == "unknown"
    assert [json.loads(line)["event"] for line in log.getvalue().splitlines()] == ["poll_failed"]
    assert watcher.level_changes["unknown"] == 0
