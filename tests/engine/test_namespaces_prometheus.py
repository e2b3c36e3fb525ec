"""Two deployments of the same name (`vllm`, job `vllm`) in two namespaces, staging and production, scraped by one
real Prometheus (Debian's package) that loads both PrometheusRules, as prometheus-operator does by default. Each
engine is a stand-in serving vLLM 0.32.0's /metrics exposition with the same load; the plans differ in their request
(R). KEDA's query had no namespace: production scaled on staging's demand too, and each namespace's rules recorded
the other's pods with its own R, into the same series. With `kvops manifests --namespace NS` each reads its own."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.support.daemons import PROMETHEUS, PrometheusServer
from tests.support.metrics_server import MetricsServer, vllm_exposition

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)"
)

PLAN = ["--model", "llama-3-8b", "--gpu", "H100-80GB", "--max-model-len", "8192", "--gen-tokens", "500"]
PROMPT = {"staging": "1000", "production": "3000"}
LOAD = {"kv_usage": 0.0, "running": 2, "waiting": 3}  # the demand counts requests at R: 5 x R


def deployed(run_kvops, tmp_path, namespace: str) -> tuple[dict, str]:
    """The namespace's rule groups and its ScaledObject's query."""
    out = tmp_path / namespace
    args = [*PLAN, "--prompt-tokens", PROMPT[namespace], "--autoscale", "keda", "--namespace", namespace]
    run_kvops("manifests", *args, "--out", str(out))
    (rule,) = [d for d in yaml.safe_load_all((out / "prometheusrule.yaml").read_text()) if d]
    (scaled,) = [d for d in yaml.safe_load_all((out / "scaledobject.yaml").read_text()) if d]
    return rule["spec"], scaled["spec"]["triggers"][0]["metadata"]["query"]


def test_each_namespace_scales_and_records_its_own_deployment(run_kvops, tmp_path):
    rules, queries = [], {}
    for namespace in PROMPT:
        spec, queries[namespace] = deployed(run_kvops, tmp_path, namespace)
        rules.append(tmp_path / f"{namespace}-rules.yaml")
        rules[-1].write_text(yaml.safe_dump(spec))
    with MetricsServer(vllm_exposition(**LOAD)) as staging, MetricsServer(vllm_exposition(**LOAD)) as production:
        hosts = {"staging": staging.target, "production": production.target}
        config = {
            "global": {"scrape_interval": "250ms", "evaluation_interval": "250ms"},
            "rule_files": [str(path) for path in rules],
            "scrape_configs": [
                {
                    "job_name": "vllm",
                    "static_configs": [
                        {"targets": [host], "labels": {"namespace": namespace, "pod": "vllm-7d9f8b6c4-x2k9p"}}
                        for namespace, host in hosts.items()
                    ],
                }
            ],
        }
        with PrometheusServer(tmp_path / "prometheus", config=config) as prometheus:
            prometheus.wait_for_series('kvops:kv_demand_tokens{job="vllm"}', count=2)
            time.sleep(3)  # a dozen evaluations of each group
            for namespace in PROMPT:
                demand = 5 * (int(PROMPT[namespace]) + 500)
                (sample,) = prometheus.wait_for_series(queries[namespace])
                assert float(sample["value"][1]) == demand, (namespace, queries[namespace])
                # only its own rules recorded its pod: over the last seconds, one value
                recorded = f'kvops:kv_demand_tokens{{namespace="{namespace}"}}[3s]'
                for over_time in ("min_over_time", "max_over_time"):
                    (sample,) = prometheus.query(f"{over_time}({recorded})")
                    assert float(sample["value"][1]) == demand, (namespace, over_time)
