"""Defects in what `kvops manifests` emits for the tools SREs run it with (llm-d's endpoint picker, KEDA), each
replayed against the tool's own source facts (tests/fixtures/gateways/upstream.json) or vendored schema
(tests/fixtures/gateways/SOURCES.md)."""

from __future__ import annotations

import pytest
import yaml

from tests.unit.deploy.test_deploy import k8s_objects
from tests.unit.deploy.test_gateways import FIXTURES, UPSTREAM, written

LLM_D = UPSTREAM["llm-d"]


def picker_config(run_kvops, tmp_path, *args: str) -> dict:
    return yaml.safe_load(written(run_kvops, tmp_path, "--target", "llm-d", *args)["epp-config.yaml"])


def plugin(config: dict, name: str) -> dict:
    return next(p for p in config["plugins"] if p["name"] == name)


def test_the_utilization_detector_filters_endpoints_in_the_scheduling_profile(run_kvops, tmp_path):
    """The detector stops routing to an endpoint past threshold x (1 + headroom) only as a Filter of the profile:
    a config that names its profiles gets no filter added (ensureSchedulingLayer). The profile listed only the
    scorers and the picker, so endpoints past kvops' critical level still took traffic; and it dropped the
    picker's default prefix-cache-scorer and weights (2, 2, 3)."""
    config = picker_config(run_kvops, tmp_path)
    (profile,) = config["schedulingProfiles"]
    refs = {ref["pluginRef"]: ref.get("weight") for ref in profile["plugins"]}
    filters = [p["name"] for p in config["plugins"] if p["type"] in LLM_D["scheduling"]["filters"]]
    assert filters == ["utilization-detector"] and all(name in refs for name in filters)
    assert config["flowControl"]["saturationDetector"]["pluginRef"] == "utilization-detector"
    weights = LLM_D["scheduling"]["default_profile_weights"]
    assert {name: refs[name] for name in weights if name in refs} == weights


def test_the_picker_scrapes_the_engine_not_the_admission_proxy(run_kvops, tmp_path):
    """The picker scrapes <pod IP>:<InferencePool target port>/metrics, every 50 ms by default; behind llm-d the
    pool targets the sidecar's proxy (the only door that applies the levels), which forwarded each scrape to the
    engine and counted it in kvops_proxy_requests_total: 20 requests/s per picker on the dashboard's admission
    panel. The metrics source now scrapes the engine's own port (its `port`, llm-d-router 0.10)."""
    files = written(run_kvops, tmp_path, "--target", "llm-d")
    config = yaml.safe_load(files["epp-config.yaml"])
    source = plugin(config, "metrics-data-source")
    assert set(source["parameters"]) <= set(LLM_D["metrics_data_source"]["parameters"])
    (deployment,) = k8s_objects(files["deployment.yaml"])
    engine, sidecar = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for c in (engine, sidecar) for p in c["ports"]}
    assert source["parameters"]["port"] == ports["http"] == 8000 and ports["kvops-proxy"] == 9401
    (layer,) = config["dataLayer"]["sources"]
    assert set(layer) <= set(LLM_D["endpoint_picker_config"]["data_layer_source_fields"])
    assert layer == {"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}
    assert (
        "InferencePool vllm (the objectives' poolRef) whose targetPorts is the pods' kvops-proxy port, 9401"
        in (files["epp-config.yaml"].splitlines()[0])
    )


def test_the_request_class_header_is_the_pickers_current_one(run_kvops, tmp_path):
    """llm-d-router 0.9 renamed x-gateway-inference-objective to x-llm-d-inference-objective (the old name an
    alias); kvops told clients the old one."""
    header = LLM_D["objective_header"]
    first = written(run_kvops, tmp_path, "--target", "llm-d")["inferenceobjectives.yaml"].splitlines()[0]
    assert f"with the {header['current']} header" in first


def strict(schema: dict) -> dict:
    """A CRD schema as `kubectl apply --validate=strict` reads it: an object's unknown fields are errors, not pruned."""
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) if isinstance(value, dict) else value for key, value in schema.items()}
    if "items" in out:
        out["items"] = strict(out["items"])
    if "properties" in out:
        out["properties"] = {name: strict(value) for name, value in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def keda_schema() -> dict:
    crd = yaml.safe_load((FIXTURES / "keda.sh_scaledobjects.yaml").read_text())
    (version,) = (v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return strict(version["schema"]["openAPIV3Schema"])


def scaled_objects(run_kvops, tmp_path) -> list[dict]:
    k8s = written(run_kvops, tmp_path / "k8s", "--autoscale", "keda", "--replicas", "2")["scaledobject.yaml"]
    stack = written(run_kvops, tmp_path / "stack", "--target", "production-stack")["scaledobject.yaml"]
    return [*k8s_objects(k8s), *k8s_objects(stack)]


def test_scaled_objects_pass_kedas_own_crd_and_set_nothing_it_ignores(run_kvops, tmp_path, jsonschema):
    """KEDA 2.20's webhook warned on every apply: "CooldownPeriod is configured but is not relevant" and the same
    for PollingInterval, both only for scaling to and from zero (minReplicaCount was 1 or more: --replicas)."""
    facts = UPSTREAM["keda"]
    for scaled in scaled_objects(run_kvops, tmp_path):
        jsonschema.validate(scaled, keda_schema())
        spec = scaled["spec"]
        assert spec["minReplicaCount"] >= 1
        assert not set(spec) & set(facts["irrelevant_with_min_replicas_above_zero"])
        (trigger,) = spec["triggers"]
        assert set(trigger["metadata"]) <= set(facts["prometheus_trigger_metadata"])


def test_the_vendored_keda_crd_catches_a_misspelt_field(jsonschema):
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "vllm"},
        "spec": {
            "scaleTargetRef": {"name": "vllm"},
            "minReplicaCount": 1,
            "triggers": [{"type": "prometheus", "metadata": {}}],
        },
    }
    jsonschema.validate(scaled, keda_schema())
    scaled["spec"]["minReplicas"] = scaled["spec"].pop("minReplicaCount")
    with pytest.raises(jsonschema.ValidationError, match="'minReplicas' was unexpected"):
        jsonschema.validate(scaled, keda_schema())
    scaled["spec"]["minReplicaCount"] = scaled["spec"].pop("minReplicas")
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 312256
    with pytest.raises(jsonschema.ValidationError, match="312256 is not of type 'string'"):
        jsonschema.validate(scaled, keda_schema())


def test_an_absent_demand_is_not_zero_demand_to_keda(run_kvops, tmp_path):
    """KEDA's Prometheus trigger read an empty result (no engine series, rules not loaded, a wrong job label) as 0
    and scaled the fleet to its minimum; with ignoreNullValues false it errs and the HPA keeps its replicas."""
    assert UPSTREAM["keda"]["ignore_null_values_default"] is True
    for scaled in scaled_objects(run_kvops, tmp_path):
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["metadata"]["ignoreNullValues"] == "false"


def gauges(exposition: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name for family in text_string_to_metric_families(exposition) if family.type == "gauge"}


def test_the_picker_reads_tgis_own_gauges(run_kvops, tmp_path):
    """llm-d's picker maps vLLM's metrics by default; on a TGI pod it found none of them, never marked the pod's
    metrics fresh, and scored every pod saturated (fail-closed): sheddable traffic always shed. For TGI the
    extractor is now given TGI's queue and batch gauges (as TGI's router exports them: the fake's wire format)."""
    from tests.support.metrics_server import vllm_exposition
    from tests.support.tgi_fake import TgiMetrics

    facts = LLM_D["core_metrics_extractor"]
    tgi = TgiMetrics()
    tgi.batch(size=3, max_tokens=9000, queue=2)
    exported = {"tgi": gauges(tgi.render()), "vllm": gauges(vllm_exposition(0.3, running=1, waiting=2))}
    defaults = facts["built_in_engines"]["vllm"]
    assert set(defaults.values()) <= exported["vllm"] and not set(defaults.values()) & exported["tgi"]

    vllm = plugin(picker_config(run_kvops, tmp_path / "vllm"), "core-metrics-extractor")
    assert "parameters" not in vllm  # the built-in vLLM mapping, the default engine
    extractor = plugin(picker_config(run_kvops, tmp_path / "tgi", "--engine", "tgi"), "core-metrics-extractor")
    parameters = extractor["parameters"]
    assert set(parameters) <= set(facts["parameters"])
    (mapping,) = parameters["engineConfigs"]
    assert set(mapping) <= set(facts["engine_config_fields"]) and mapping["name"] not in facts["built_in_engines"]
    assert parameters["defaultEngine"] == mapping["name"] == "tgi"
    specs = {mapping["queuedRequestsSpec"], mapping["runningRequestsSpec"]}
    assert specs == {"tgi_queue_size", "tgi_batch_current_size"} and specs <= exported["tgi"]


def vllm_metrics_source(version: str) -> str | None:
    """The metric-registering source of a vLLM release: the installed one's, or a wheel .ci/newer_vllm unpacked."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    installed = Path(spec.origin).parent if spec and spec.origin else None
    cached = Path.home() / ".cache" / "kvops-ci" / f"vllm-{version}" / "vllm"
    for tree in (cached, installed):
        release = tree / "_version.py" if tree else None
        if release and release.is_file() and f"'{version}" in release.read_text().replace('"', "'"):
            return "".join(path.read_text() for path in sorted((tree / "v1" / "metrics").glob("*.py")))
    return None


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
def test_the_pickers_vllm_mapping_reads_names_each_release_exports(version):
    """The picker's built-in vLLM mapping (the one kvops leaves in place for vLLM) names series every supported
    release registers; a renamed one would leave the pods stale, hence saturated."""
    source = vllm_metrics_source(version)
    if source is None:
        pytest.skip(f"vLLM {version} is neither installed nor unpacked (.ci/newer_vllm unpacks 0.33.0 and 0.34.0)")
    for name in LLM_D["core_metrics_extractor"]["built_in_engines"]["vllm"].values():
        assert f'"{name}"' in source, (version, name)
