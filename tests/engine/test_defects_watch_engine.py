"""Defects found using `kvops watch` against real daemons (Prometheus, Alertmanager, promtool); each test replays one."""

from __future__ import annotations

import json

import pytest

from tests.support.daemons import PROMETHEUS, PrometheusServer
from tests.support.metrics_server import MetricsServer, vllm_exposition

needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)"
)


@needs_prometheus
def test_one_engine_scraped_by_two_jobs_is_named_not_read_twice(tmp_path, run_kvops):
    """A real Prometheus scraping one engine under two jobs: `--once --json` read running 6 for 3, the pool doubled;
    with `--replica-label pod` (no such label) the replica '(no pod label)' was read as an engine."""
    with (
        MetricsServer(vllm_exposition(0.5, running=3, waiting=2)) as engine,
        PrometheusServer(tmp_path / "prometheus", {"vllm": [engine.target], "pods": [engine.target]}) as prometheus,
    ):
        prometheus.wait_for_series("vllm:kv_cache_usage_perc", count=2)
        watch = ("watch", "--engine", "vllm", "--prometheus", prometheus.url, "--once", "--json")
        both = json.loads(run_kvops(*watch, expect=3).stdout)["replicas"]
        assert [(r["name"], r["level"]) for r in both] == [(engine.target, "unknown")]
        assert both[0]["error"].startswith("scraped by 2 jobs (pods, vllm)")
        one = json.loads(run_kvops(*watch, "--selector", '{job="vllm"}').stdout)["replicas"]
        assert (one[0]["reading"]["running"], one[0]["reading"]["waiting"]) == (3, 2)
        unlabelled = json.loads(run_kvops(*watch, "--replica-label", "pod", expect=3).stdout)["replicas"]
        assert unlabelled[0]["error"].startswith("series without a pod label (they have instance, job)")
