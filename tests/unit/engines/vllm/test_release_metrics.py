"""Every vLLM series kvops reads (the watcher's SERIES, the shipped alert and recording rules, which KEDA and the HPA
scale on, and the dashboard) is registered by the installed vLLM, or is a retired name kvops reads only where its
replacement is absent: a release that renames one fails here, not in the users' alerts. Run on 0.32 in the suite
and on 0.33 and 0.34 by .ci/newer_vllm (each wheel first on PYTHONPATH). The names are read from the release's
source (`"vllm:..."` literals under vllm/: vllm/v1/metrics/loggers.py, the KV connectors' and offloading's
metrics.py), since registering them needs an engine."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from kvops.engines.vllm import metrics
from tests.support.paths import REPO

pytestmark = pytest.mark.vllm
NAME = re.compile(r"vllm:[A-Za-z_][A-Za-z0-9_:]*")
SUFFIXES = ("_total", "_count", "_sum", "_bucket")  # prometheus_client's sample names of a family
ADDED = {metrics.OFFLOAD_CONFIG: (0, 33)}  # read where present: vllm-project/vllm#49307 added it in 0.33
SHIPPED = ["configs/alerts/vllm-rules.yaml", "configs/k8s/vllm/prometheusrule.yaml", "configs/grafana/kvops.json"]


def installed() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    return Path(spec.origin).parent


def registered() -> set[str]:
    return {
        name for path in installed().rglob("*.py") for name in re.findall(r'"(vllm:[A-Za-z0-9_:]+)"', path.read_text())
    }


def release() -> tuple[int, ...]:
    """The installed release, from its _version.py (`__version_tuple__ = version_tuple = (0, 34, 0)`)."""
    found = re.search(r"version_tuple = \((\d+), (\d+)", (installed() / "_version.py").read_text())
    assert found, "no version tuple in vllm/_version.py"
    return (int(found[1]), int(found[2]))


def family(name: str) -> str:
    return next((name.removesuffix(suffix) for suffix in SUFFIXES if name.endswith(suffix)), name)


def read_by_kvops() -> set[str]:
    shipped = {name for path in SHIPPED for name in NAME.findall((REPO / path).read_text())}
    return {family(name) for name in (*metrics.SERIES, *shipped)}


def test_every_vllm_series_kvops_reads_is_registered_by_the_installed_release():
    names = registered()
    retired = {family(name) for name in metrics.CATALOGUE.retired}
    not_yet = {name for name, added in ADDED.items() if release() < added}
    missing = read_by_kvops() - names - {family(name) for name in names}
    assert missing - retired - not_yet == set()
    assert metrics.KV_USAGE in names and family(metrics.PREEMPTIONS) in names  # the reading finds names
