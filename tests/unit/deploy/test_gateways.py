"""`kvops manifests --autoscale` and `--target llm-d|dynamo|production-stack`: each object passes its project's own
schema (kubernetes-validate and kubernetes-models for Kubernetes and KEDA objects, the llm-d CRD, production-stack's
values.schema.json) or matches the names and ranges its source reads (tests/fixtures/gateways/upstream.json), and
every threshold comes from the same policy and plan."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from tests.support.paths import REPO
from tests.unit.deploy.test_deploy import EXAMPLE, K8S_VERSIONS, k8s_objects, validate_with_kubernetes_models

FIXTURES = REPO / "tests" / "fixtures" / "gateways"
UPSTREAM = json.loads((FIXTURES / "upstream.json").read_text())


def written(run_kvops, tmp_path, *args: str) -> dict[str, str]:
    out = tmp_path / "out"
    run_kvops("manifests", *EXAMPLE, *args, "--out", str(out))
    return {path.name: path.read_text() for path in out.iterdir()}


def plan(run_kvops) -> dict:
    return json.loads(run_kvops("plan", *EXAMPLE, "--json").stdout)


def target_tokens(plan_json: dict) -> int:
    """The warn level (0.7) of the pool vLLM's usage is a fraction of (the pool less its null block)."""
    capacity = plan_json["capacity"]
    pool = capacity["kv_tokens"] * capacity["usable_blocks"] // capacity["num_blocks"]
    return int(0.7 * pool)


@pytest.mark.parametrize("kind", ["keda", "hpa"])
def test_autoscaling_objects_pass_the_schemas_and_scale_on_the_recorded_demand(run_kvops, tmp_path, kind):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[test]'; .ci/run does)"
    )

    files = written(run_kvops, tmp_path, "--autoscale", kind, "--replicas", "2", "--max-replicas", "6")
    objects = [o for name in sorted(files) if name.endswith(".yaml") for o in k8s_objects(files[name])]
    status, results = validate_with_kubernetes_models(objects)
    assert [(r["kind"], r["errors"]) for r in results] == [(o["kind"], []) for o in objects] and status == 0
    target = str(target_tokens(plan(run_kvops)))
    if kind == "keda":
        scaled = yaml.safe_load(files["scaledobject.yaml"])
        spec = scaled["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm"}
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 6)
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior == {"scaleDown": {"stabilizationWindowSeconds": 600}}
        trigger = spec["triggers"][0]
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        assert trigger["metadata"] == {
            "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
            "query": 'sum(kvops:kv_demand_tokens{job="vllm",pod=~"vllm-.*"})',
            "threshold": target,
            "ignoreNullValues": "false",
        }
        return
    hpa = yaml.safe_load(files["hpa.yaml"])
    adapter = yaml.safe_load(files["prometheus-adapter.yaml"])
    for document in (hpa, adapter):
        for version in K8S_VERSIONS:
            assert kubernetes_validate.validate(document, version, strict=True) == version
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "kvops_kv_demand_tokens"},
                "target": {"type": "AverageValue", "averageValue": target},
            },
        }
    ]
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    config = yaml.safe_load(adapter["data"]["config.yaml"])
    facts = UPSTREAM["prometheus-adapter"]
    assert set(config) <= set(facts["config_fields"])
    (rule,) = config["rules"]
    assert set(rule) <= set(facts["rule_fields"]) and set(rule["resources"]) <= set(facts["resources_fields"])
    assert set(rule["name"]) <= set(facts["name_fields"])
    assert all(set(v) <= set(facts["group_resource_fields"]) for v in rule["resources"]["overrides"].values())
    assert all(template in rule["metricsQuery"] for template in facts["metrics_query_templates"])


def test_the_cool_down_is_the_engine_containers_readiness_budget(run_kvops, tmp_path):
    files = written(run_kvops, tmp_path, "--autoscale", "keda")
    deployment = yaml.safe_load(files["deployment.yaml"])
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    advanced = yaml.safe_load(files["scaledobject.yaml"])["spec"]["advanced"]["horizontalPodAutoscalerConfig"]
    assert advanced["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == (
        probe["periodSeconds"] * probe["failureThreshold"]
    )


def test_llm_d_settings_match_its_source_and_the_policy(run_kvops, tmp_path, jsonschema):
    files = written(run_kvops, tmp_path, "--target", "llm-d")
    assert {"deployment.yaml", "epp-config.yaml", "inferenceobjectives.yaml"} <= set(files)
    config = yaml.safe_load(files["epp-config.yaml"])
    facts = UPSTREAM["llm-d"]["endpoint_picker_config"]
    assert config["apiVersion"] == facts["api_version"] and config["kind"] == "EndpointPickerConfig"
    assert set(facts["required"]) <= set(config) <= set(facts["fields"])
    names = [p["name"] for p in config["plugins"]]
    assert len(set(names)) == len(names)
    for plugin in config["plugins"]:
        assert set(plugin) <= set(facts["plugin_fields"])
        assert plugin["type"] in UPSTREAM["llm-d"]["registered_plugin_types"]["types"]
    for profile in config["schedulingProfiles"]:
        assert set(profile) <= set(facts["profile_fields"])
        assert all(
            set(ref) <= set(facts["profile_plugin_fields"]) and ref["pluginRef"] in names for ref in profile["plugins"]
        )
    assert set(config["flowControl"]) <= set(facts["flow_control_fields"])
    assert config["flowControl"]["saturationDetector"]["pluginRef"] in names
    detector = next(p for p in config["plugins"] if p["type"] == "utilization-detector")["parameters"]
    ranges = UPSTREAM["llm-d"]["utilization_detector"]["parameters"]
    assert set(detector) <= set(ranges)
    assert isinstance(detector["queueDepthThreshold"], int) and detector["queueDepthThreshold"] > 0
    assert 0 < detector["kvCacheUtilThreshold"] <= 1 and detector["headroom"] >= 0
    # the policy's levels: sheddable traffic goes at degrade (0.85), the endpoint filter stops at critical (0.95)
    assert (detector["kvCacheUtilThreshold"], detector["queueDepthThreshold"]) == (0.85, 5)
    assert math.isclose(min(1.0, 0.85 * (1 + detector["headroom"])), 0.95, abs_tol=1e-4)

    schema = yaml.safe_load((FIXTURES / "llm-d.ai_inferenceobjectives.yaml").read_text())
    version = next(v for v in schema["spec"]["versions"] if v["name"] == "v1alpha2")
    objectives = k8s_objects(files["inferenceobjectives.yaml"])
    for objective in objectives:
        assert objective["apiVersion"] == f"{schema['spec']['group']}/v1alpha2"
        jsonschema.validate(objective, version["schema"]["openAPIV3Schema"])
    assert {o["metadata"]["name"]: o["spec"]["priority"] for o in objectives} == {
        "vllm-sheddable": -1,
        "vllm-standard": 0,
    }


def test_the_inference_objective_schema_catches_a_wrong_type(jsonschema):
    schema = yaml.safe_load((FIXTURES / "llm-d.ai_inferenceobjectives.yaml").read_text())
    version = next(v for v in schema["spec"]["versions"] if v["name"] == "v1alpha2")["schema"]["openAPIV3Schema"]
    with pytest.raises(jsonschema.ValidationError, match="'high' is not of type 'integer'"):
        jsonschema.validate({"spec": {"poolRef": {"name": "p"}, "priority": "high"}}, version)


def test_dynamo_thresholds_are_its_own_flags_at_the_critical_level(run_kvops, tmp_path):
    files = written(run_kvops, tmp_path, "--target", "dynamo")
    lines = [line for line in files["dynamo-frontend.env"].splitlines() if line and not line.startswith("#")]
    env = dict(line.split("=", 1) for line in lines)
    arguments = UPSTREAM["dynamo"]["arguments"]
    assert set(env) == {spec["env"] for spec in arguments.values()}
    for spec in arguments.values():
        value = env[spec["env"]]
        if value == "None":
            continue
        number = float(value) if spec["type"] == "nullable_float" else int(value)
        low, high = spec.get("range", (0, math.inf))
        assert low <= number <= high
    capacity = plan(run_kvops)["capacity"]
    pool = capacity["kv_tokens"] * capacity["usable_blocks"] // capacity["num_blocks"]
    assert env["DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD"] == "0.95"
    assert env["DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD"] == str(int(0.95 * pool))


def test_production_stack_values_pass_the_charts_schema_and_keda_is_ours(run_kvops, tmp_path, jsonschema):
    files = written(run_kvops, tmp_path, "--target", "production-stack", "--release", "prod")
    schema = json.loads((FIXTURES / "production-stack-values.schema.json").read_text())
    values = yaml.safe_load(files["values.yaml"])
    jsonschema.validate(values, schema)
    (model,) = values["servingEngineSpec"]["modelSpec"]
    flags = plan(run_kvops)["flags"]
    assert model["vllmConfig"]["maxModelLen"] == flags["max-model-len"] == 8192
    assert model["modelURL"] == flags["model"] and "keda" not in model
    assert "--scheduler-cls" not in model["vllmConfig"]["extraArgs"]  # the chart runs the official image
    # the chart's own keda.triggers cannot hold the list KEDA needs: its schema says object
    listed = json.loads(json.dumps(values))
    listed["servingEngineSpec"]["modelSpec"][0]["keda"] = {"enabled": True, "triggers": [{"type": "prometheus"}]}
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'object'"):
        jsonschema.validate(listed, schema)
    scaled = yaml.safe_load(files["scaledobject.yaml"])
    assert scaled["spec"]["scaleTargetRef"]["name"] == "prod-vllm-deployment-vllm"
    assert scaled["spec"]["triggers"][0]["metadata"]["query"] == (
        'sum(kvops:kv_demand_tokens{pod=~"prod-vllm-deployment-vllm-.*"})'
    )
    status, results = validate_with_kubernetes_models([scaled, *k8s_objects(files["prometheusrule.yaml"])])
    assert status == 0, results
    rules = yaml.safe_load(files["prometheusrule.yaml"].split("\n", 1)[1])["spec"]["groups"]
    assert 'vllm:kv_cache_usage_perc{pod=~"prod-vllm-deployment-vllm-.*"}' in rules[0]["rules"][0]["expr"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "dynamo", "--autoscale", "keda"], "--autoscale applies to --target k8s and llm-d, not dynamo"),
        (["--autoscale", "vpa"], "'vpa' is not one of 'keda', 'hpa'"),
    ],
)
def test_gateway_mistakes_are_one_line(run_kvops, args, message):
    result = run_kvops("manifests", *EXAMPLE, *args, expect=2)
    assert message in result.stderr and "Traceback" not in result.stderr


def test_the_namespace_scopes_kedas_query_and_every_rule(run_kvops, tmp_path):
    """KEDA's query and the rules named the job and pods but no namespace: where one Prometheus scrapes staging
    and production, each running `vllm`, production scaled on both (tests/engine/test_namespaces_prometheus.py
    replays it on a real Prometheus). `--namespace` names where the files are applied; the production-stack
    query and rules too, whose selector is the chart's pods."""
    files = written(run_kvops, tmp_path / "k8s", "--autoscale", "keda", "--namespace", "prod")
    query = yaml.safe_load(files["scaledobject.yaml"])["spec"]["triggers"][0]["metadata"]["query"]
    assert query == 'sum(kvops:kv_demand_tokens{job="vllm",pod=~"vllm-.*",namespace="prod"})'
    groups = yaml.safe_load(files["prometheusrule.yaml"].split("\n", 1)[1])["spec"]["groups"]
    exprs = [rule["expr"] for group in groups for rule in group["rules"]]
    assert all('{job="vllm",namespace="prod"}' in expr for expr in exprs), exprs
    stack = written(run_kvops, tmp_path / "stack", "--target", "production-stack", "--release", "r", "--namespace", "a")
    query = yaml.safe_load(stack["scaledobject.yaml"])["spec"]["triggers"][0]["metadata"]["query"]
    assert query == 'sum(kvops:kv_demand_tokens{pod=~"r-vllm-deployment-vllm-.*",namespace="a"})'


def test_keda_without_a_namespace_says_what_it_sums(run_kvops):
    result = run_kvops("manifests", *EXAMPLE, "--autoscale", "keda")
    assert "--autoscale keda without --namespace" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--namespace", "Prod"], "'Prod' must be lowercase letters, digits and '-'"),
        (["--target", "compose", "--out", "x", "--namespace", "prod"], "--target compose has none"),
    ],
)
def test_namespace_mistakes_are_one_line(run_kvops, args, message):
    result = run_kvops("manifests", *EXAMPLE, *args, expect=2)
    assert message in result.stderr and "Traceback" not in result.stderr
