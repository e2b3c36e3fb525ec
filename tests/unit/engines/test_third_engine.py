"""Adding an engine is one package and one registry line: a third engine registered in the registry alone is
planned, rendered in every format, deployed, watched and alerted on by the rest of kvops unchanged."""

from __future__ import annotations

import json

import pytest
import yaml

from kvops import engines
from kvops.deploy import compose, k8s
from kvops.deploy.stack import Stack
from kvops.engines.metrics import Samples
from kvops.gpus import find_gpu
from kvops.model import load_model
from kvops.plan import PlanInputs
from kvops.planner import plan
from kvops.policy import default_policy_text
from kvops.render.plan import render
from kvops.watch.rules import alert_rules
from tests.support.metrics_server import vllm_exposition
from tests.support.third_engine import NAME


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setitem(engines.REGISTRY, NAME, "tests.support.third_engine")
    monkeypatch.setattr(engines, "NAMES", (*engines.NAMES, NAME))


def fork_plan(**changes):
    return plan(PlanInputs(NAME, load_model("qwen3-8b"), find_gpu("L40S"), max_model_len=8192, **changes))


def test_it_plans_and_renders_in_every_format():
    result = fork_plan()
    assert result.fits and result.argv[0] == "fork-serve" and result.port == 30000
    assert render(result, "text").startswith("Fork plan: Qwen/Qwen3-8B on 1 x L40S")
    docker = render(result, "docker")
    assert "--shm-size 8g -p 30000:30000 -v ~/models:/models" in docker and "example.org/fork:1.0" in docker
    assert json.loads(render(result, "json"))["engine"] == NAME
    assert "VLLM_ARGS" not in render(result, "env") and "FORK_ARGS=(" in render(result, "env")
    ways = plan(PlanInputs(NAME, load_model("llama-3.1-70b"), find_gpu("L40S"), max_model_len=8192)).ways_out
    assert any(way.change == "--tp 4" and way.fits for way in ways)


def test_it_is_deployed_and_alerted_on():
    result = fork_plan()
    rules = alert_rules(NAME, "prometheusrule")
    stack = Stack(
        plan=result,
        rules=rules,
        policy_text=default_policy_text(),
        command="kvops manifests --engine fork",
        name="fork",
        kvops_image="kvops:test",
    )
    documents = [yaml.safe_load(text.split("\n", 1)[1]) for text in k8s.manifests(stack).values()]
    pod = next(doc for doc in documents if doc["kind"] == "Deployment")["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert (engine["name"], engine["image"], engine["ports"][0]["containerPort"]) == (
        "fork",
        "example.org/fork:1.0",
        30000,
    )
    assert "initContainers" not in pod  # no scheduler plugin to give it
    services = yaml.safe_load(compose.files(stack, "{}")["compose.yaml"].split("\n", 1)[1])["services"]
    assert services["fork"]["shm_size"] == "8g" and services["fork"]["volumes"] == ["fork-models:/models"]


def test_its_metrics_are_read_through_its_adapter():
    reading = engines.get(NAME).metrics.reading(Samples.from_exposition(vllm_exposition(0.72)))
    assert reading.kv_usage == 0.72
