"""kvops' alerting and autoscaling outputs through the real components they are written for: Debian's Prometheus,
promtool and Alertmanager on free 127.0.0.1 ports, and the watcher's own endpoints read as KEDA reads them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.daemons import PROMETHEUS, PrometheusServer
from tests.support.metrics_server import MetricsServer, vllm_exposition
from tests.support.processes import REPO, checkout_env

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
