"""docker-compose: the engine, the kvops sidecar, Prometheus with kvops' alert rules, and Grafana with the kvops
dashboard.

The engine's image and arguments are the plan's (`kvops plan --format docker` runs the same) with kvops_vllm's
flags; where the middleware applies the levels in the engine (`Stack.middleware`), the engine publishes its own
port and the sidecar is `kvops watch`; elsewhere the sidecar is `kvops watch --proxy` and publishes the proxy's.
Prometheus scrapes both and loads the rule file `kvops alerts --format rules` prints; Grafana is provisioned with
that Prometheus and `kvops dashboard`.
"""

from __future__ import annotations

from typing import Any

from kvops import engines
from kvops.deploy.stack import PLUGIN_COPY, PLUGIN_DIR, POLICY_FILE, Stack, dump_yaml
from kvops.render.plan import in_container, model_mount

PROMETHEUS_IMAGE = "prom/prometheus:v3.5.0"  # keep_firing_for in the rules needs Prometheus >= 2.42
GRAFANA_IMAGE = "grafana/grafana:11.6.0"
RULES_FILE = "kvops-rules.yaml"
DASHBOARD_FILE = "kvops-dashboard.json"


def files(stack: Stack, dashboard: str) -> dict[str, str]:
    """File name -> text; compose.yaml refers to the others by relative path."""
    return {
        "compose.yaml": stack.header(f"{stack.engine}, the kvops sidecar, Prometheus and Grafana: docker compose up")
        + dump_yaml(compose(stack)),
        "prometheus.yml": stack.header(
            "Prometheus: the engine's /metrics, the sidecar's /kvops/metrics, kvops' alert rules"
        )
        + dump_yaml(prometheus_config(stack)),
        RULES_FILE: stack.rules,
        "policy.yaml": stack.policy_text,
        "grafana-datasources.yaml": stack.header("Grafana's data source: the stack's Prometheus")
        + dump_yaml(GRAFANA_DATASOURCES),
        "grafana-dashboards.yaml": stack.header("Grafana loads the kvops dashboard from this folder")
        + dump_yaml(GRAFANA_DASHBOARDS),
        DASHBOARD_FILE: dashboard,
    }


GRAFANA_DATASOURCES = {
    "apiVersion": 1,
    "datasources": [
        {
            "name": "Prometheus",
            "type": "prometheus",
            "uid": "prometheus",
            "access": "proxy",
            "url": "http://prometheus:9090",
            "isDefault": True,
        },
    ],
}
GRAFANA_DASHBOARDS = {
    "apiVersion": 1,
    "providers": [
        {"name": "kvops", "type": "file", "options": {"path": "/var/lib/grafana/dashboards"}},
    ],
}


def compose(stack: Stack) -> dict[str, Any]:
    plan = stack.plan
    container = engines.get(stack.engine).container
    command = literal(in_container(plan, stack.engine_args()))
    engine: dict[str, Any] = {"image": plan.image, "command": command, "environment": ["HF_TOKEN"]}
    engine.update(container.compose_shared_memory)
    engine["volumes"] = [f"{container.compose_cache}:{container.model_cache}"]
    mount = model_mount(plan)
    if mount:
        engine["volumes"] += literal([f"{mount[0]}:{mount[1]}:ro"])
    engine.update(_gpus(stack))
    services: dict[str, Any] = {stack.engine: engine}
    volumes: dict[str, Any] = {container.compose_cache: {}} if container.compose_cache_is_volume else {}
    # clients reach the engine's port where its middleware applies the levels, else the proxy's; /kvops/* stays inside
    sidecar_ports = {"ports": [f"{stack.engine_port}:{stack.proxy_port}"]} if stack.proxied else {}
    if not stack.proxied:
        engine["ports"] = [f"{stack.engine_port}:{stack.engine_port}"]
    if stack.with_plugin:
        engine["environment"] += [f"{name}={value}" for name, value in stack.plugin_env().items()]
        engine["volumes"] += [f"kvops-python:{PLUGIN_DIR}:ro", f"./policy.yaml:{POLICY_FILE}:ro"]
        engine["depends_on"] = {"kvops-plugin": {"condition": "service_completed_successfully"}}
        services["kvops-plugin"] = {
            "image": stack.kvops_image,
            "entrypoint": ["python", "-c", PLUGIN_COPY],
            "volumes": [f"kvops-python:{PLUGIN_DIR}"],
        }
        volumes["kvops-python"] = {}
    health = (
        f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{stack.kvops_port}/kvops/healthz', timeout=2)"
    )
    services["kvops"] = {
        "image": stack.kvops_image,
        "command": stack.watch_args(stack.engine),
        **sidecar_ports,
        "volumes": [f"./policy.yaml:{POLICY_FILE}:ro"],
        "healthcheck": {"test": ["CMD", "python", "-c", health], "interval": "10s", "timeout": "3s", "retries": 3},
    }
    services["prometheus"] = {
        "image": PROMETHEUS_IMAGE,
        "ports": ["9090:9090"],
        "volumes": [
            "./prometheus.yml:/etc/prometheus/prometheus.yml:ro",
            f"./{RULES_FILE}:/etc/prometheus/{RULES_FILE}:ro",
        ],
    }
    services["grafana"] = {
        "image": GRAFANA_IMAGE,
        "ports": ["3000:3000"],
        "environment": ["GF_AUTH_ANONYMOUS_ENABLED=true", "GF_AUTH_ANONYMOUS_ORG_ROLE=Viewer"],
        "volumes": [
            "./grafana-datasources.yaml:/etc/grafana/provisioning/datasources/kvops.yaml:ro",
            "./grafana-dashboards.yaml:/etc/grafana/provisioning/dashboards/kvops.yaml:ro",
            f"./{DASHBOARD_FILE}:/var/lib/grafana/dashboards/{DASHBOARD_FILE}:ro",
        ],
    }
    document: dict[str, Any] = {"name": f"kvops-{stack.name}", "services": services}
    if volumes:
        document["volumes"] = volumes
    return document


def literal(words: list[str]) -> list[str]:
    """Words as Compose passes them: it interpolates `$VAR` and `${VAR}` in the whole file, and `$$` is a literal `$`
    (the Compose specification, "Interpolation"), so a `$` in a pasted value reaches the engine as written."""
    return [word.replace("$", "$$") for word in words]


def prometheus_config(stack: Stack) -> dict[str, Any]:
    interval = f"{stack.scrape_interval}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [RULES_FILE],  # relative to this file
        "scrape_configs": [
            {"job_name": stack.engine_job, "static_configs": [{"targets": [f"{stack.engine}:{stack.engine_port}"]}]},
            {
                "job_name": stack.kvops_job,
                "metrics_path": "/kvops/metrics",
                "static_configs": [{"targets": [f"kvops:{stack.kvops_port}"]}],
            },
        ],
    }


def _gpus(stack: Stack) -> dict[str, Any]:
    inputs = stack.plan.inputs
    if inputs.gpu is not None and inputs.gpu.vendor == "amd":
        return {"devices": ["/dev/kfd", "/dev/dri"], "group_add": ["video"]}
    count = inputs.gpus or inputs.tp
    return {
        "deploy": {
            "resources": {"reservations": {"devices": [{"driver": "nvidia", "count": count, "capabilities": ["gpu"]}]}}
        }
    }
