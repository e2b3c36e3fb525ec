"""Autoscaling on KV headroom: a KEDA ScaledObject, or an HPA with the prometheus-adapter rule that feeds it.

Both scale the engine's Deployment on `kvops:kv_demand_tokens` (kvops/watch/headroom.py; recorded per replica by
the rules of `kvops alerts --plan`), against a target demand per replica of the warn level times the plan's pool:
KEDA's Prometheus trigger with metricType AverageValue, and the HPA's Pods metric with an averageValue, both run
ceil(sum of demand / target) replicas. The scale-down cool-down is the plan's readiness budget (the engine
container's readinessProbe periodSeconds x failureThreshold), the HPA's scale-down stabilization window (KEDA passes
its own through advanced.horizontalPodAutoscalerConfig): removing a replica sooner than a new one can start makes
the fleet oscillate. `runbooks/README.md` says how to choose the target.

KEDA (kedacore/keda v2.20.2): with minReplicaCount >= 1 its cooldownPeriod and pollingInterval do nothing (they
govern scaling to and from zero; its admission webhook warns of both, apis/keda/v1alpha1/scaledobject_webhook.go),
so the ScaledObject sets neither. Its Prometheus trigger reads an empty result as 0 unless ignoreNullValues is false
(pkg/scalers/prometheus_scaler.go): the demand is absent only where no engine series is scraped or the rules are not
loaded, which is not zero demand, so the trigger errs and the HPA keeps the replicas it has, as the HPA on
prometheus-adapter does when the adapter finds no series.
"""

from __future__ import annotations

from typing import Any

from kvops.deploy.stack import Stack
from kvops.errors import KvopsError, UsageError
from kvops.frozen import frozen
from kvops.policy import Level
from kvops.watch.rules import DEMAND

KINDS = ("keda", "hpa")
METRIC = DEMAND.replace(":", "_")  # the custom-metrics API name (no colons)
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"  # prometheus-operator's Service


@frozen
class Scaling:
    min_replicas: int
    max_replicas: int
    target_tokens: int  # demand per replica
    cooldown_seconds: int
    prometheus_url: str = PROMETHEUS_URL


def scaling(stack: Stack, max_replicas: int | None, prometheus_url: str, readiness: dict[str, int]) -> Scaling:
    """Replicas from the options, the target from the policy's warn level and the plan's pool, the cool-down from
    the engine container's readiness probe."""
    figures, policy = stack.figures, stack.policy
    if figures is None or policy is None:
        raise KvopsError("autoscaling needs the plan's KV pool and the policy's warn level")
    if max_replicas is not None and max_replicas < stack.replicas:
        raise UsageError(
            f"--max-replicas {max_replicas} is below --replicas {stack.replicas}, the fewest pods the autoscaler keeps; "
            f"give {stack.replicas} or more"
        )
    warn = policy.thresholds[Level.WARN]
    return Scaling(
        min_replicas=stack.replicas,
        max_replicas=max_replicas or 4 * stack.replicas,
        target_tokens=int(warn * figures.usable_tokens),
        cooldown_seconds=readiness["periodSeconds"] * readiness["failureThreshold"],
        prometheus_url=prometheus_url,
    )


def pod_matcher(deployment: str) -> str:
    """The Deployment's pods, named <deployment>-<hash>-<id>."""
    return f'pod=~"{deployment}-.*"'


def demand_query(deployment: str, job: str | None, namespace: str | None = None) -> str:
    """The fleet's demand: the pods of the Deployment, in its namespace where it is given."""
    matchers = ([f'job="{job}"'] if job else []) + [pod_matcher(deployment)]
    matchers += [f'namespace="{namespace}"'] if namespace else []
    return f"sum({DEMAND}{{{','.join(matchers)}}})"


def scaled_object(
    stack: Stack, scale: Scaling, deployment: str | None = None, job: str | None = None
) -> dict[str, Any]:
    """KEDA's ScaledObject (keda.sh/v1alpha1) with a Prometheus trigger, for the stack's Deployment or another's."""
    target = deployment or stack.name
    query = demand_query(target, stack.engine_job if deployment is None else job, stack.namespace)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": target, "labels": _labels(stack)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicaCount": scale.min_replicas,
            "maxReplicaCount": scale.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(scale)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": scale.prometheus_url,
                        "query": query,
                        "threshold": str(scale.target_tokens),
                        "ignoreNullValues": "false",  # no series is not zero demand: hold the replicas
                    },
                }
            ],
        },
    }


def horizontal_pod_autoscaler(stack: Stack, scale: Scaling) -> dict[str, Any]:
    """autoscaling/v2 on the per-pod demand the prometheus-adapter rule serves."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": stack.name, "labels": _labels(stack)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": stack.name},
            "minReplicas": scale.min_replicas,
            "maxReplicas": scale.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(scale.target_tokens)},
                    },
                }
            ],
            "behavior": _behavior(scale),
        },
    }


def adapter_rule(stack: Stack) -> dict[str, Any]:
    """prometheus-adapter's discovery rule (kubernetes-sigs/prometheus-adapter, pkg/config/config.go): the
    recorded demand per pod, as the custom metric the HPA reads."""
    return {
        "seriesQuery": f'{DEMAND}{{job="{stack.engine_job}",namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{DEMAND}$", "as": METRIC},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }


def adapter_config_map(stack: Stack) -> dict[str, Any]:
    """The rule as prometheus-adapter's --config file (its Helm chart takes the same rule under rules.custom)."""
    from kvops.deploy.stack import dump_yaml

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{stack.name}-prometheus-adapter", "labels": _labels(stack)},
        "data": {"config.yaml": dump_yaml({"rules": [adapter_rule(stack)]})},
    }


def files(stack: Stack, kind: str, scale: Scaling) -> dict[str, str]:
    """`--autoscale keda`: the ScaledObject; `hpa`: the HPA and prometheus-adapter's rule."""
    from kvops.deploy.stack import dump_yaml

    if kind == "keda":
        return {
            "scaledobject.yaml": stack.header("KEDA scales the engine on its KV demand")
            + dump_yaml(scaled_object(stack, scale))
        }
    return {
        "prometheus-adapter.yaml": stack.header("prometheus-adapter serves the KV demand per pod to the HPA")
        + dump_yaml(adapter_config_map(stack)),
        "hpa.yaml": stack.header("the HPA scales the engine on its KV demand")
        + dump_yaml(horizontal_pod_autoscaler(stack, scale)),
    }


def _behavior(scale: Scaling) -> dict[str, Any]:
    return {"scaleDown": {"stabilizationWindowSeconds": scale.cooldown_seconds}}


def _labels(stack: Stack) -> dict[str, str]:
    return {"app.kubernetes.io/name": stack.name, "app.kubernetes.io/part-of": "kvops"}
