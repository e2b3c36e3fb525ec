"""What the dashboard's `job` variable and KEDA's trigger read, from a real Prometheus (Debian's package) scraping a
real `kvops watch` and a STAND-IN engine (a real HTTP server serving the vLLM 0.32.0 CPU build's recorded /metrics,
KV at 30%, 1 running, 2 waiting), under the jobs and pod labels `kvops manifests --name llama` gives them (its
PodMonitor: the engine as job "llama", the sidecar's /kvops/metrics as "kvops-llama"), evaluating the manifests'
own rules. No engine runs: the stand-in is enough for what the queries select."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kvops.deploy.grafana import JOBS_QUERY, JOBS_REGEX, NAMESPACES_QUERY
from tests.support.daemons import PROMETHEUS, PrometheusServer
from tests.support.metrics_server import MetricsServer, vllm_exposition
from tests.support.paths import REPO
from tests.support.watch_process import WatchProcess
from tests.unit.deploy.test_deploy import EXAMPLE

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)"
)

POD = {"namespace": "default", "pod": "llama-7c9f8d6b5-x2k4p"}  # a pod of Deployment llama


def manifests(run_kvops, out: Path, *args: str) -> dict[str, str]:
    run_kvops("manifests", *EXAMPLE, *args, "--out", str(out))
    return {path.name: path.read_text() for path in out.iterdir()}


def rule_file(path: Path, prometheus_rule: str) -> Path:
    (rule,) = (d for d in yaml.safe_load_all(prometheus_rule) if d)
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def grafana_job_values(prometheus: PrometheusServer) -> list[str]:
    """The variable as Grafana fills it: label_values(metric, label) is the label-values API matched on the metric,
    each value kept as the regex's capture group, those that do not match dropped."""
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", JOBS_QUERY).groups()
    values = prometheus.get_json(f"/api/v1/label/{label}/values", **{"match[]": metric})["data"]
    pattern = re.compile(JOBS_REGEX.strip("/"))
    return sorted(m.group(1) for value in values if (m := pattern.search(value)))


def grafana_namespace_values(prometheus: PrometheusServer, job: str) -> list[str]:
    """The namespace variable as Grafana fills it for the selected job: label_values(selector, label)."""
    selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", NAMESPACES_QUERY).groups()
    matched = selector.replace("$job", job)
    return sorted(prometheus.get_json(f"/api/v1/label/{label}/values", **{"match[]": matched})["data"])


def test_a_named_deployment_shows_on_the_dashboard_and_keda_reads_its_demand(run_kvops, tmp_path):
    named = manifests(run_kvops, tmp_path / "llama", "--name", "llama", "--autoscale", "keda")
    unnamed = manifests(run_kvops, tmp_path / "vllm", "--autoscale", "keda")
    trigger = yaml.safe_load(named["scaledobject.yaml"].split("\n", 1)[1])["spec"]["triggers"][0]["metadata"]
    elsewhere = yaml.safe_load(unnamed["scaledobject.yaml"].split("\n", 1)[1])["spec"]["triggers"][0]["metadata"]
    dashboard = json.loads((REPO / "configs" / "grafana" / "kvops.json").read_text())
    with (
        MetricsServer(vllm_exposition(0.30, running=1, waiting=2)) as engine,
        WatchProcess("--engine", "vllm", "--metrics-url", engine.url, "--interval", "0.5") as watch,
    ):
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rule_file(tmp_path / "rules.yaml", named["prometheusrule.yaml"]))],
            "scrape_configs": [
                {"job_name": "llama", "static_configs": [{"targets": [engine.target], "labels": POD}]},
                {
                    "job_name": "kvops-llama",
                    "metrics_path": "/kvops/metrics",
                    "static_configs": [{"targets": [f"127.0.0.1:{watch.port}"], "labels": POD}],
                },
            ],
        }
        with PrometheusServer(tmp_path / "prometheus", config=config) as prometheus:
            prometheus.wait_for_series('kvops_kv_cache_usage_ratio{job="kvops-llama"}')
            prometheus.wait_for_series('kvops:kv_demand_tokens{job="llama"}')
            # the variable lists the deployment; the options it had, vllm and tgi, select none of its series
            jobs = grafana_job_values(prometheus)
            assert jobs == ["llama"]
            usage = dashboard["panels"][0]["targets"][0]["expr"].replace("$namespace", ".*")  # All
            assert prometheus.query(usage.replace("$job", "llama"))[0]["value"][1] == "0.3"
            assert prometheus.query(usage.replace("$job", "(vllm|tgi)")) == []
            # the namespace variable lists the deployment's; a deployment of the same name elsewhere is not shown
            assert grafana_namespace_values(prometheus, "llama") == ["default"]
            scoped = dashboard["panels"][0]["targets"][0]["expr"].replace("$job", "llama")
            assert prometheus.query(scoped.replace("$namespace", "default"))[0]["value"][1] == "0.3"
            assert prometheus.query(scoped.replace("$namespace", "staging")) == []
            # KEDA's trigger: one element (KEDA errs on more), the recorded demand; under another deployment's
            # job the result is empty, which KEDA read as 0 until ignoreNullValues was false
            (demand,) = prometheus.query(trigger["query"])
            (recorded,) = prometheus.query('kvops:kv_demand_tokens{job="llama"}')
            assert demand["value"][1] == recorded["value"][1] and float(demand["value"][1]) > 0
            assert prometheus.query(elsewhere["query"]) == []
            assert trigger["ignoreNullValues"] == elsewhere["ignoreNullValues"] == "false"
