"""Kubernetes: the engine Deployment with the kvops sidecar, a Service, the PrometheusRule and a PodMonitor for both
/metrics endpoints.

The engine container is `kvops plan --format k8s` as printed; the Deployment adds to it only kvops_vllm's flags,
environment and volumes (the admission middleware, the KV guard). Clients reach the engine's own port where its
middleware applies the levels (`Stack.middleware`), else the sidecar's proxy (the Service targets its port, not the
port of the /kvops/* endpoints). Behind a gateway, a fleet, the proxy stays; there (`gateway=True`: llm-d) the sidecar also reads which networks
it takes X-KVops-Priority from out of a ConfigMap the operator fills (`trust_env`); without one it trusts no one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvops import engines
from kvops.deploy.stack import PLUGIN_COPY, PLUGIN_DIR, POLICY_DIR, Stack, dump_yaml
from kvops.plan import Plan
from kvops.render.plan import image_args, require_gpu_deployment

SIDECAR_PORT_NAME = "kvops"
PROXY_PORT_NAME = "kvops-proxy"
LOCALHOST = "127.0.0.1"  # containers of a pod share its network namespace
TRUST_ENV = "KVOPS_TRUST_PRIORITY_FROM"  # kvops watch --trust-priority-from, from the environment
TRUST_KEY = "trust-priority-from"  # the key of the gateway's ConfigMap that holds those networks
RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def manifests(stack: Stack) -> dict[str, str]:
    """File name -> YAML text, in the order `kubectl apply -f` should see them."""
    return {
        "policy-configmap.yaml": stack.header("kvops policy for the sidecar and the KV guard")
        + dump_yaml(policy_config_map(stack)),
        "deployment.yaml": stack.header(f"{stack.engine} with the kvops sidecar") + dump_yaml(deployment(stack)),
        "service.yaml": stack.header(_service_says(stack)) + dump_yaml(service(stack)),
        "podmonitor.yaml": stack.header("Prometheus scrapes the engine's /metrics and the sidecar's /kvops/metrics")
        + dump_yaml(pod_monitor(stack)),
        "prometheusrule.yaml": stack.header("kvops alerts") + stack.rules,
    }


def labels(stack: Stack) -> dict[str, str]:
    return {"app.kubernetes.io/name": stack.name, "app.kubernetes.io/part-of": "kvops"}


def policy_config_map(stack: Stack) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": _policy_name(stack), "labels": labels(stack)},
        "data": {"policy.yaml": stack.policy_text},
    }


def engine_container(plan: Plan, with_plugin: bool = False) -> dict[str, Any]:
    """The engine's container: the plan's image and arguments, its GPUs, a readiness probe, the HF token if any.
    `kvops plan --format k8s` prints it, without the KV guard's flag (the official image has no plugin); the
    Deployment adds the guard's environment and volumes to it (with_plugin: the flag kept)."""
    require_gpu_deployment(plan, "k8s")
    gpu = plan.inputs.gpu
    resource = "amd.com/gpu" if gpu is not None and gpu.vendor == "amd" else "nvidia.com/gpu"
    hf_token = {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}
    container: dict[str, Any] = {
        "name": engines.get(plan.engine).container.name,
        "image": plan.image,
        "args": list(plan.args) if with_plugin else image_args(plan),
        "ports": [{"name": "http", "containerPort": plan.port}],
        "resources": {"limits": {resource: plan.inputs.devices}},
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": plan.port},
            "periodSeconds": 10,
            "failureThreshold": 60,
        },
        "env": [{"name": "HF_TOKEN", "valueFrom": hf_token}],
    }
    if engines.get(plan.engine).container.k8s_shared_memory:
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
    return container


def trust_config_map_name(stack: Stack) -> str:
    """The ConfigMap naming the gateway's networks, the only clients whose X-KVops-Priority the proxy reads."""
    return f"{stack.name}-kvops-gateway"


def trust_env(stack: Stack) -> list[dict[str, Any]]:
    """The sidecar's --trust-priority-from, read from the gateway's ConfigMap: optional, so that without it (or with
    its value empty) no client is trusted."""
    reference = {"name": trust_config_map_name(stack), "key": TRUST_KEY, "optional": True}
    return [{"name": TRUST_ENV, "valueFrom": {"configMapKeyRef": reference}}]


def deployment(stack: Stack, gateway: bool = False) -> dict[str, Any]:
    if gateway:
        stack = replace(stack, fleet=True)  # the proxy stays: it reads the priority from the gateway's networks
    engine = engine_container(stack.plan, with_plugin=stack.with_plugin)
    if stack.with_plugin:
        engine["args"] = stack.engine_args()
    volumes = [
        {"name": mount["name"], "emptyDir": {"medium": "Memory"}}
        for mount in engine.get("volumeMounts", [])
        if mount["name"] == "shm"
    ]
    volumes.append({"name": "kvops-policy", "configMap": {"name": _policy_name(stack)}})
    pod: dict[str, Any] = {}
    if stack.with_plugin:
        engine.setdefault("env", []).extend(
            {"name": name, "value": value} for name, value in stack.plugin_env().items()
        )
        engine.setdefault("volumeMounts", []).extend(
            [
                {"name": "kvops-python", "mountPath": PLUGIN_DIR, "readOnly": True},
                {"name": "kvops-policy", "mountPath": POLICY_DIR, "readOnly": True},
            ]
        )
        volumes.append({"name": "kvops-python", "emptyDir": {}})
        pod["initContainers"] = [
            {
                "name": "kvops-plugin",
                "image": stack.kvops_image,
                "command": ["python", "-c", PLUGIN_COPY],
                "volumeMounts": [{"name": "kvops-python", "mountPath": PLUGIN_DIR}],
                "securityContext": RESTRICTED,
            }
        ]
    pod["containers"] = [engine, sidecar(stack, gateway)]
    pod["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": stack.name, "labels": labels(stack)},
        "spec": {
            "replicas": stack.replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": stack.name}},
            # GPUs are usually all taken: replace a pod in place rather than wait for a GPU that a surge pod needs
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": {"labels": labels(stack)}, "spec": pod},
        },
    }


def sidecar(stack: Stack, gateway: bool = False) -> dict[str, Any]:
    health = {"httpGet": {"path": "/kvops/healthz", "port": SIDECAR_PORT_NAME}}
    return {
        "name": "kvops",
        "image": stack.kvops_image,
        "command": ["kvops"],
        "args": stack.watch_args(LOCALHOST),
        **({"env": trust_env(stack)} if gateway else {}),
        "ports": [{"name": SIDECAR_PORT_NAME, "containerPort": stack.kvops_port}]
        + ([{"name": PROXY_PORT_NAME, "containerPort": stack.proxy_port}] if stack.proxied else []),
        "readinessProbe": {**health, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "volumeMounts": [{"name": "kvops-policy", "mountPath": POLICY_DIR, "readOnly": True}],
        "securityContext": RESTRICTED,
    }


def service(stack: Stack) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": stack.name, "labels": labels(stack)},
        "spec": {
            "selector": {"app.kubernetes.io/name": stack.name},
            "ports": [
                {"name": "http", "port": stack.engine_port, "targetPort": _client_port(stack), "protocol": "TCP"}
            ],
        },
    }


def _service_says(stack: Stack) -> str:
    """Where the Service sends clients, as its file's header says."""
    if stack.proxied:
        return "clients go through the kvops admission proxy"
    return f"clients reach the engine's own port: its admission middleware ({stack.middleware}) applies the levels"


def pod_monitor(stack: Stack) -> dict[str, Any]:
    interval = f"{stack.scrape_interval}s"

    def endpoint(port: str, path: str, job: str) -> dict[str, Any]:
        return {
            "port": port,
            "path": path,
            "interval": interval,
            "relabelings": [{"action": "replace", "targetLabel": "job", "replacement": job}],
        }

    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": stack.name, "labels": labels(stack)},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": stack.name}},
            "podMetricsEndpoints": [
                endpoint("http", "/metrics", stack.engine_job),
                endpoint(SIDECAR_PORT_NAME, "/kvops/metrics", stack.kvops_job),
            ],
        },
    }


def _client_port(stack: Stack) -> str:
    """The pod port clients reach: the engine's own with the middleware, else the proxy's (never /kvops/*)."""
    return PROXY_PORT_NAME if stack.proxied else "http"


def _policy_name(stack: Stack) -> str:
    return f"{stack.name}-kvops-policy"
