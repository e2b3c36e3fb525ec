"""The kvops levels as a gateway's settings (kvops/watch/saturation.py): llm-d, NVIDIA Dynamo, vLLM production-stack.

Each function builds what that project reads, checked against its own source or schema in tests/fixtures/gateways/:

- llm-d: an EndpointPickerConfig (llm-d.ai/v1alpha1, apix/config/v1alpha1/endpointpickerconfig_types.go) whose
  utilization-detector sheds sheddable traffic from the degrade level and, listed in the scheduling profile as the
  filter it also is, stops routing to an endpoint at the critical level; the profile keeps the picker's default
  scorers and weights (pkg/epp/config/loader/defaults.go), and the picker reads the engine's /metrics on the
  engine's own port (metrics-data-source `port`), not through the admission proxy the InferencePool targets. And
  InferenceObjectives (llm-d.ai/v1alpha2) for a sheddable class (priority -1) and a standard one (0); the sidecar
  reads X-KVops-Priority only from the gateway's networks, named in a ConfigMap (empty: none);
- Dynamo: the frontend's rejection thresholds as environment variables (DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD, ...,
  components/src/dynamo/common/configuration/groups/router_args.py);
- production-stack: Helm values for the model (the plan's vllmConfig), and a KEDA ScaledObject on the KV demand
  for the chart's Deployment: the chart's own `keda.triggers` is typed an object in its values.schema.json while
  its template renders a list, so a list of triggers there fails Helm's schema check.
"""

from __future__ import annotations

from typing import Any

from kvops import engines
from kvops.deploy.autoscale import Scaling
from kvops.deploy.stack import Stack, dump_yaml
from kvops.engines.flags import flag_args, with_kept
from kvops.errors import KvopsError
from kvops.watch.saturation import GatewayLevels

TARGETS = ("llm-d", "dynamo", "production-stack")
LLMD_CONFIG_API = "llm-d.ai/v1alpha1"
LLMD_OBJECTIVE_API = "llm-d.ai/v1alpha2"
DETECTOR = "utilization-detector"
# the picker's default scorers and weights (llm-d-router pkg/epp/config/loader/defaults.go, loadDefaultConfig)
SCORERS = (("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0), ("prefix-cache-scorer", 3.0))
PICKER = "max-score-picker"
METRICS_SOURCE, METRICS_EXTRACTOR = "metrics-data-source", "core-metrics-extractor"
# The header a client names its class with (pkg/epp/metadata/consts.go, since llm-d-router 0.9; the old name is an
# alias the picker still reads), and the classes: sheddable first under saturation.
OBJECTIVE_HEADER, OLD_OBJECTIVE_HEADER = "x-llm-d-inference-objective", "x-gateway-inference-objective"
OBJECTIVES = (("sheddable", -1), ("standard", 0))


def levels(stack: Stack) -> GatewayLevels:
    if stack.policy is None:
        raise KvopsError("the gateway settings need the policy's levels")
    return GatewayLevels.from_policy(stack.policy)


def endpoint_picker_config(stack: Stack) -> dict[str, Any]:
    """The picker's config: the detector as the flow controller's saturation detector (read with the feature gate
    off too, by the legacy admission) and as the profile's filter; the engine's metrics scraped on its own port."""
    gate = levels(stack)
    detector = {
        "name": DETECTOR,
        "type": DETECTOR,
        "parameters": {
            "queueDepthThreshold": gate.queue_depth_threshold,
            "kvCacheUtilThreshold": gate.kv_cache_util_threshold,
            "headroom": gate.headroom,
        },
    }
    metrics = {"name": METRICS_SOURCE, "type": METRICS_SOURCE, "parameters": {"port": stack.engine_port}}
    plugins = [detector, *({"name": name, "type": name} for name, _ in SCORERS), {"name": PICKER, "type": PICKER}]
    plugins += [metrics, metrics_extractor(stack.engine)]
    profile = [
        {"pluginRef": DETECTOR},
        *({"pluginRef": name, "weight": weight} for name, weight in SCORERS),
        {"pluginRef": PICKER},
    ]
    return {
        "apiVersion": LLMD_CONFIG_API,
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}],
        "dataLayer": {"sources": [{"pluginRef": METRICS_SOURCE, "extractors": [{"pluginRef": METRICS_EXTRACTOR}]}]},
        "flowControl": {"saturationDetector": {"pluginRef": DETECTOR}},
    }


def metrics_extractor(engine_name: str) -> dict[str, Any]:
    """The picker's reader of the engine's metrics. It maps vLLM's itself; for another engine (TGI) it is given the
    engine's waiting and running gauges, else it finds none of vLLM's names on the pods, never marks their metrics
    fresh, and scores every pod saturated: sheddable traffic always shed. No KV gauge: the picker's KV term stays 0
    and the admission proxy in each pod applies the KV levels."""
    extractor: dict[str, Any] = {"name": METRICS_EXTRACTOR, "type": METRICS_EXTRACTOR}
    load = engines.get(engine_name).gateway_load_metrics
    if load is not None:
        waiting, running = load
        mapping = {"name": engine_name, "queuedRequestsSpec": waiting, "runningRequestsSpec": running}
        extractor["parameters"] = {"defaultEngine": engine_name, "engineConfigs": [mapping]}
    return extractor


def inference_objectives(stack: Stack) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": LLMD_OBJECTIVE_API,
            "kind": "InferenceObjective",
            "metadata": {"name": f"{stack.name}-{name}", "labels": _labels(stack)},
            "spec": {"poolRef": {"name": stack.name}, "priority": priority},
        }
        for name, priority in OBJECTIVES
    ]


def dynamo_environment(stack: Stack) -> list[tuple[str, str]]:
    """The frontend's rejection thresholds: a worker is busy at the critical level (KV blocks), or with more
    prefill tokens pending than the critical level leaves of its pool; with every worker busy, it answers 529."""
    gate = levels(stack)
    if stack.figures is None:
        raise KvopsError("Dynamo's thresholds need the plan's KV pool")
    pool = stack.figures.usable_tokens
    return [
        ("DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", f"{gate.busy_kv_fraction:g}"),
        ("DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", str(int(gate.busy_kv_fraction * pool))),
        ("DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", "None"),
    ]


CHART_OWNS = ("--port", "--host")  # helm/templates/deployment-vllm-multi.yaml passes its own


def production_stack_values(stack: Stack) -> dict[str, Any]:
    """The chart's modelSpec entry for the plan (helm/values.schema.json, servingEngineSpec.modelSpec)."""
    flags = stack.plan.flags
    inputs = stack.plan.inputs
    image, _, tag = stack.plan.image.rpartition(":")
    named = {
        "max-model-len": "maxModelLen",
        "max-num-seqs": "maxNumSeqs",
        "gpu-memory-utilization": "gpuMemoryUtilization",
        "tensor-parallel-size": "tensorParallelSize",
    }
    config: dict[str, Any] = {key: flags[flag] for flag, key in named.items() if flag in flags}
    adapter = engines.get(stack.engine)  # the chart runs the official image, without kvops_vllm
    plugins = {"scheduler-cls": adapter.guard_scheduler, "middleware": adapter.admission_middleware}
    rest = {
        flag: value
        for flag, value in flags.items()
        if flag not in named and flag != "model" and not (flag in plugins and value == plugins[flag])
    }
    # a pasted command's options the plan did not read go too, but the port and host: the chart serves on its own
    kept = tuple(option for option in inputs.kept_options if option[0] not in CHART_OWNS)
    config["extraArgs"] = with_kept(flag_args(rest), dict(flags), kept)
    return {
        "servingEngineSpec": {
            "modelSpec": [
                {
                    "name": stack.name,
                    "repository": image,
                    "tag": tag,
                    "modelURL": flags["model"],
                    "replicaCount": stack.replicas,
                    "requestGPU": inputs.devices,
                    "vllmConfig": config,
                }
            ]
        }
    }


def production_stack_files(stack: Stack, scale: Scaling, deployment: str) -> dict[str, str]:
    """The chart's values for the model, the recording and alert rules for its pods, and the ScaledObject for the
    chart's Deployment (<release>-<model>-deployment-vllm, helm/templates/deployment-vllm-multi.yaml)."""
    from kvops.deploy.autoscale import scaled_object

    return {
        "values.yaml": stack.header("production-stack Helm values for the plan (helm install -f values.yaml)")
        + dump_yaml(production_stack_values(stack)),
        "prometheusrule.yaml": stack.header("kvops alerts and the KV headroom of the chart's engine pods")
        + stack.rules,
        "scaledobject.yaml": stack.header("KEDA scales the chart's engine on its KV demand")
        + dump_yaml(scaled_object(stack, scale, deployment)),
    }


def gateway_trust_config_map(stack: Stack) -> dict[str, Any]:
    """The networks the sidecar reads X-KVops-Priority from: empty (no one) until the operator names the gateway's."""
    from kvops.deploy import k8s

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": k8s.trust_config_map_name(stack), "labels": _labels(stack)},
        "data": {k8s.TRUST_KEY: ""},
    }


def llm_d_files(stack: Stack) -> dict[str, str]:
    from kvops.deploy import k8s

    trust = k8s.trust_config_map_name(stack)
    return {
        "deployment.yaml": stack.header(
            f"{stack.engine} with the kvops sidecar, X-KVops-Priority read from the networks in ConfigMap {trust}"
        )
        + dump_yaml(k8s.deployment(stack, gateway=True)),
        "gateway-trust.yaml": stack.header(
            "the networks of the gateway that sets X-KVops-Priority (CIDR[,CIDR]; empty: no client is trusted, "
            "every request standard); restart the pods after setting them"
        )
        + dump_yaml(gateway_trust_config_map(stack)),
        "epp-config.yaml": stack.header(
            f"llm-d's endpoint picker at kvops' levels (its --config-file), for InferencePool {stack.name} (the "
            f"objectives' poolRef) whose targetPorts is the pods' kvops-proxy port, {stack.proxy_port}"
        )
        + dump_yaml(endpoint_picker_config(stack)),
        "inferenceobjectives.yaml": stack.header(
            f"request classes: name one with the {OBJECTIVE_HEADER} header ({OLD_OBJECTIVE_HEADER} before llm-d-router 0.9)"
        )
        + "---\n".join(dump_yaml(o) for o in inference_objectives(stack)),
    }


def dynamo_files(stack: Stack) -> dict[str, str]:
    lines = "".join(f"{name}={value}\n" for name, value in dynamo_environment(stack))
    return {
        "dynamo-frontend.env": stack.header("Dynamo's frontend rejection thresholds at kvops' critical level") + lines
    }


def _labels(stack: Stack) -> dict[str, str]:
    return {"app.kubernetes.io/name": stack.name, "app.kubernetes.io/part-of": "kvops"}
