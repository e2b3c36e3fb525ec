"""kvops' alerting and autoscaling outputs through the real components they are written for: Debian's Prometheus,
promtool and Alertmanager on free 127.0.0.1 ports, and the watcher's own endpoints read as KEDA reads them."""

from __future__ import annotations

import functools
import subprocess
import sys
import time

import pytest
import yaml

from kvops.policy import load_policy
from kvops.watch.alerts import catalogue
from kvops.watch.rules import widened
from tests.support.daemons import ALERTMANAGER, PROMETHEUS, PROMTOOL, AlertmanagerServer, PrometheusServer
from tests.support.metrics_server import MetricsServer, vllm_exposition
from tests.support.processes import REPO, checkout_env
from tests.support.receiver import WebhookReceiver

needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)"
)


@needs_prometheus
def test_watch_given_a_real_prometheus_query_path_names_its_base_url(tmp_path):
    """`kvops watch --prometheus http://127.0.0.1:P/api/v1/query --once` against a real Prometheus: exit 3 and
    "HTTP Status Code 404"; now exit 4 and the base URL to give, which then reads the engine."""
    with (
        MetricsServer(vllm_exposition(0.5)) as engine,
        PrometheusServer(tmp_path / "prometheus", {"vllm": [engine.target]}) as prometheus,
    ):
        prometheus.wait_for_series("vllm:kv_cache_usage_perc")

        def once(url: str) -> subprocess.CompletedProcess:
            command = ["watch", "--engine", "vllm", "--prometheus", url, "--selector", '{job="vllm"}', "--once"]
            return subprocess.run(
                [sys.executable, "-m", "kvops", *command, "--timeout", "20"],
                cwd=REPO,
                env=checkout_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )

        wrong, right = once(prometheus.url + "/api/v1/query"), once(prometheus.url)
    assert wrong.returncode == 4 and wrong.stderr == (
        f"kvops: error: --prometheus {prometheus.url}/api/v1/query is not Prometheus' base URL "
        f"({prometheus.url}/api/v1/query/api/v1/query answered 404): give the server's base URL, {prometheus.url}\n"
    )
    assert right.returncode == 0 and right.stdout.startswith("level ok   kv usage 50.0%"), right.stdout


def _wait(fetch, predicate, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if predicate(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:.0f} s; last: {value}")
        time.sleep(0.2)


def _states(prometheus: PrometheusServer) -> dict[str, str]:
    """Prometheus' alerts by name, with their state (pending, firing)."""
    return {a["labels"]["alertname"]: a["state"] for a in prometheus.get_json("/api/v1/alerts")["data"]["alerts"]}


def _notified(receiver: WebhookReceiver, name: str, status: str) -> list[dict]:
    """Alertmanager's webhook notifications (whole bodies) holding alert `name` with `status`."""
    with receiver.lock:
        bodies = [post["body"] for post in receiver.posts]
    return [b for b in bodies if any(a["labels"]["alertname"] == name and a["status"] == status for a in b["alerts"])]


@pytest.mark.skipif(ALERTMANAGER is None, reason="prometheus-alertmanager not installed (.ci/run installs it)")
@needs_prometheus
def test_rules_route_through_prometheus_and_alertmanager_as_the_runbooks_say(tmp_path, run_kvops):
    """`kvops alerts` rules evaluated by a real Prometheus on a stand-in vLLM /metrics, sent to a real Alertmanager
    routing to a webhook: each level alert waits its `for:` (the policy's dwell) pending, fires with its severity,
    `serving_engine`, the target's labels and `runbook_url` BASE/<alertname>.md; grouped by instance, the critical
    alert inhibits warn and degrade on `severity` as runbooks/README.md says to; it resolves after keep_firing_for."""
    dwell, base = 6, "https://runbooks.example.org/kvops"
    (tmp_path / "policy.yaml").write_text(f"min_dwell_seconds: {dwell}\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        run_kvops(
            "alerts",
            "--engine",
            "vllm",
            "--policy",
            str(tmp_path / "policy.yaml"),
            "--scrape-interval",
            "1",
            "--selector",
            '{job="vllm"}',
            "--runbook-url",
            base,
        ).stdout
    )
    with WebhookReceiver() as receiver, MetricsServer(vllm_exposition(0.2)) as engine:
        alertmanager = AlertmanagerServer(tmp_path / "am")
        route = {"receiver": "hook", "group_by": ["instance"], "group_wait": "1s", "group_interval": "1s"}
        config = {
            "route": {**route, "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": receiver.url, "send_resolved": True}]}],
            "inhibit_rules": [
                {
                    "source_matchers": ['severity="critical"'],
                    "target_matchers": ['severity="warning"'],
                    "equal": ["instance", "serving_engine"],
                }
            ],
        }
        (alertmanager.workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))
        prometheus_config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager.port}"]}]}]},
            "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [engine.target]}]}],
        }
        with alertmanager, PrometheusServer(tmp_path / "prometheus", config=prometheus_config) as prometheus:
            prometheus.wait_for_series('vllm:kv_cache_usage_perc{job="vllm"}')
            engine.set(vllm_exposition(0.97))
            raised = time.monotonic()
            states = functools.partial(_states, prometheus)
            assert (
                _wait(states, lambda s: "KVCacheCritical" in s, what="KVCacheCritical pending")["KVCacheCritical"]
                == "pending"
            )
            (body,) = _wait(lambda: _notified(receiver, "KVCacheCritical", "firing"), bool, what="critical notified")[
                :1
            ]
            assert time.monotonic() - raised >= dwell
            assert body["groupLabels"] == {"instance": engine.target}
            assert [a["labels"]["alertname"] for a in body["alerts"]] == ["KVCacheCritical"]  # warn, degrade inhibited
            (critical,) = body["alerts"]
            assert critical["labels"] == {
                "alertname": "KVCacheCritical",
                "severity": "critical",
                "serving_engine": "vllm",
                "instance": engine.target,
                "job": "vllm",
                "engine": "0",
                "model_name": "tiny-llama",
            }
            assert critical["annotations"] == {
                "summary": f"KV cache of {engine.target} is 95% full or more",
                "description": f"KV cache usage on {engine.target} is 97% (critical at 95%): new requests are "
                "rejected with 503 and Retry-After: 10.",
                "runbook_url": f"{base}/kvcachecritical.md",
            }
            assert (REPO / "runbooks" / "kvcachecritical.md").exists()
            held = {a["labels"]["alertname"]: a for a in alertmanager.alerts()}
            assert {name: held[name]["labels"]["severity"] for name in held} == {
                "KVCacheWarn": "warning",
                "KVCacheDegrade": "warning",
                "KVCacheCritical": "critical",
            }
            assert held["KVCacheWarn"]["status"]["inhibitedBy"] and held["KVCacheDegrade"]["status"]["inhibitedBy"]
            assert held["KVCacheWarn"]["annotations"]["runbook_url"] == f"{base}/kvcachewarn.md"
            engine.set(vllm_exposition(0.2))
            lowered = time.monotonic()
            (resolved,) = _wait(lambda: _notified(receiver, "KVCacheCritical", "resolved"), bool, what="resolved")[:1]
            assert time.monotonic() - lowered >= dwell  # keep_firing_for: the dwell on the way down
            assert resolved["status"] == "resolved" and resolved["alerts"][0]["endsAt"] > critical["startsAt"]
            _wait(alertmanager.alerts, lambda alerts: not alerts, what="Alertmanager holds no active alert")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; .ci/run does)")
def test_each_level_alert_fires_at_its_threshold_and_not_just_below(tmp_path, run_kvops):
    """`promtool test rules` at the policy's edges, which tests/unit/watch/test_alerts.py does not try: each level
    alert fires at exactly its threshold (the policy's "at or above", as the watcher enters a level) and not at
    0.001 below it, nor before its `for:`."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(run_kvops("alerts", "--engine", "vllm", "--scrape-interval", "15").stdout)
    series = 'vllm:kv_cache_usage_perc{job="vllm",instance="gpu-0:8000",engine="0"}'
    labels = {"job": "vllm", "instance": "gpu-0:8000", "engine": "0", "serving_engine": "vllm"}
    kinds = {kind.name: kind for kind in catalogue(widened(load_policy(), 15), "vllm")}
    cases = []
    for name, threshold, severity in (
        ("KVCacheWarn", 0.70, "warning"),
        ("KVCacheDegrade", 0.85, "warning"),
        ("KVCacheCritical", 0.95, "critical"),
    ):
        for usage, at, fires in ((threshold, "1m", True), (threshold - 0.001, "1m", False), (threshold, "15s", False)):
            annotations = kinds[name].annotations("gpu-0:8000", f"{threshold:.0%}", "runbooks")
            expected = [{"exp_labels": {**labels, "severity": severity}, "exp_annotations": annotations}]
            expected = expected if fires else []
            cases.append(
                {
                    "interval": "15s",
                    "input_series": [{"series": series, "values": f"{usage}x8"}],
                    "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}],
                }
            )
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "15s", "tests": cases}))
    ran = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
