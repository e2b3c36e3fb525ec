"""`kvops watch` never dies of its inputs: an engine killed mid-watch, HTTP 500, a hang past the poll timeout,
garbage, NaN, a renamed metric. The process keeps running, says so in its JSON log, reports `unknown`, counts
the failures and raises the metrics-stale alert after `stale_after_failures` of them."""

import os
import signal

from tests.support.metrics_server import MetricsServer, spawn, vllm_exposition
from tests.support.receiver import WebhookReceiver
from tests.support.vllm_server import free_port
from tests.support.watch_process import WatchProcess

POLICY = "min_dwell_seconds: 1\nunknown:\n  mode: fail-open\n  stale_after_failures: 3\n"


def test_each_fault_is_survived_reported_and_counted(tmp_path):
    (tmp_path / "policy.yaml").write_text(POLICY)
    with (
        MetricsServer(vllm_exposition(0.75)) as server,
        WebhookReceiver() as receiver,
        WatchProcess(
            "--engine",
            "vllm",
            "--metrics-url",
            server.url,
            "--policy",
            str(tmp_path / "policy.yaml"),
            "--interval",
            "0.2",
            "--timeout",
            "1.5",
            "--webhook",
            receiver.url,
        ) as watch,
    ):
        watch.wait_level("warn")
        faults = [
            ("HTTP 500", dict(body="oops", status=500), f"{server.url} answered HTTP 500 Internal Server Error"),
            ("hang", dict(body=vllm_exposition(0.75), delay=5.0), f"no answer from {server.url} within 1.5 s"),
            ("garbage", dict(body="\x00\x01 this is not {{ a metric"), "not the Prometheus text format"),
            ("NaN", dict(body=vllm_exposition("NaN")), "vllm:kv_cache_usage_perc is NaN"),
            (
                "renamed",
                dict(body=vllm_exposition(0.75, rename={"vllm:kv_cache_usage_perc": "vllm:kv_cache_used_ratio"})),
                "found vllm:kv_cache_used_ratio: renamed?",
            ),
        ]
        for name, fault, message in faults:
            failed_before = watch.metric("kvops_poll_failures_total", instance=server.target)
            server.set(fault.pop("body"), **fault)
            failure = watch.wait_event(lambda e: e["event"] == "poll_failed" and message in e["error"], timeout=20)
            assert failure["consecutive_failures"] == 1, name
            stale = watch.wait_event(lambda e: e["event"] == "metrics_stale" and message in e["error"], timeout=20)
            assert stale["consecutive_failures"] == 3, name
            document = watch.policy()
            assert (
                document["level"] == "unknown"
                and document["kv_usage"] is None
                and document["limits"]["max_tokens_cap"] is None
            ), name  # fail-open
            assert watch.get("/kvops/healthz")[0] == 200 and watch.process.poll() is None, name
            assert watch.metric("kvops_poll_failures_total", instance=server.target) >= failed_before + 3, name
            assert watch.metric("kvops_level") == -1
            server.set(vllm_exposition(0.75))
            watch.wait_level("warn", timeout=20)
            watch.wait_event(
                lambda e: e["event"] == "poll_recovered" and e["after_failures"] >= 3 and e["time"] > stale["time"],
                timeout=20,
            )
        stale_alerts = receiver.wait_for(
            lambda alerts: (
                sum(a["labels"]["alertname"] == "KVMetricsStale" and "endsAt" in a for a in alerts) >= len(faults)
            )
        )
        assert sum(a["labels"]["alertname"] == "KVMetricsStale" and "endsAt" not in a for a in stale_alerts) >= len(
            faults
        )
        assert watch.stop() == 0
    assert watch.events()[-1]["event"] == "stopped" and watch.events()[-1]["poll_failures"] >= 3 * len(faults)
    assert not watch.other_output  # no traceback, no stray output: JSON lines only


def test_engine_killed_mid_watch_and_restarted(tmp_path):
    port = free_port()
    body = tmp_path / "metrics.prom"
    body.write_text(vllm_exposition(0.9))
    url = f"http://127.0.0.1:{port}/metrics"
    engine = spawn(port, body)
    try:
        with WatchProcess("--engine", "vllm", "--metrics-url", url, "--interval", "0.2", "--timeout", "1") as watch:
            watch.wait_level("degrade")
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait(timeout=10)
            failure = watch.wait_event(lambda e: e["event"] == "poll_failed")
            assert (
                failure["error"].startswith(f"cannot read {url}: ClientConnectorError")
                and "Connect call failed" in failure["error"]
            )
            assert (
                watch.wait_event(lambda e: e["event"] == "level_changed" and e["to"] == "unknown")["from"] == "degrade"
            )
            watch.wait_event(lambda e: e["event"] == "metrics_stale")
            assert watch.policy()["level"] == "unknown" and watch.get("/kvops/healthz")[0] == 200
            engine = spawn(port, body)
            watch.wait_level("degrade", timeout=20)
            assert watch.wait_event(lambda e: e["event"] == "poll_recovered")["kv_usage"] == 0.9
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait(timeout=10)
