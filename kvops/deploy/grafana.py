"""The Grafana dashboard: KV usage on the policy's bands, the level, queue, preemptions, tokens per second, what the
admission proxy or the engine's admission middleware did, the KV demand against the pool (what autoscaling scales on), the prefix-cache hit rate, GPU
memory, time to first token and per output token, and the host KV tier.

Engine series come from each engine's adapter (`engines.get(name).metrics.dashboard(selector, rate)`, a panel
key to its queries): a panel shows every engine's, each empty for the other engine. Engine series are selected by
`job=~"$job"` (the middleware's counters too: they are on the engine's /metrics), the sidecar's by
`job=~"kvops-$job"` (the jobs `kvops manifests` scrapes them as), the recording
rules of `kvops alerts --plan` by the engine's job; each also by `namespace=~"$namespace"`, since a deployment's
name, and so its job, can be in several namespaces; the device's memory, where a DCGM exporter runs, by its own
metric names.
"""

from __future__ import annotations

import json
from typing import Any

from kvops import engines
from kvops.policy import GRADED, Level, Policy
from kvops.watch.rules import DEMAND, GPU_MEMORY, USABLE

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# $namespace: two deployments of one name in two namespaces share a job (kvops manifests names it after the
# deployment); All is ".*", which also matches series with no namespace label (compose's)
ENGINE = 'job=~"$job",namespace=~"$namespace"'
KVOPS = 'job=~"kvops-$job",namespace=~"$namespace"'
RATE = "$__rate_interval"
# The engine jobs: those of the sidecars that export kvops_level (kvops-<job>, what `kvops manifests --name` and
# compose scrape them as), less the prefix (Grafana keeps a regex's capture group as the value); refreshed on load.
JOBS_QUERY = "label_values(kvops_level, job)"
JOBS_REGEX = "/^kvops-(.+)$/"
NAMESPACES_QUERY = 'label_values(kvops_level{job=~"kvops-$job"}, namespace)'
# NVIDIA's dcgm-exporter: framebuffer used and free, MiB. vLLM reserves --gpu-memory-utilization of it at start.
DCGM_USED, DCGM_FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
BAND_COLORS = {
    Level.OK: "green",
    Level.WARN: "yellow",
    Level.DEGRADE: "orange",
    Level.CRITICAL: "red",
    Level.UNKNOWN: "text",
}


def engine_queries(key: str) -> list[tuple[str, str]]:
    """Every engine's queries for a panel, in the registry's order."""
    return [query for name in engines.NAMES for query in engines.get(name).metrics.dashboard(ENGINE, RATE).get(key, [])]


def dashboard(policy: Policy) -> str:
    bands = ", ".join(f"{level.label} {policy.thresholds[level]:.0%}" for level in GRADED)
    level_steps: list[tuple[float | None, str]] = [(None, BAND_COLORS[Level.OK])] + [
        (policy.thresholds[level], BAND_COLORS[level]) for level in GRADED
    ]
    panels = [
        _timeseries(
            1,
            "KV cache usage",
            (0, 0, 16, 9),
            [("kvops_kv_cache_usage_ratio{" + KVOPS + "}", "{{instance}} kvops watch"), *engine_queries("kv_usage")],
            unit="percentunit",
            description=f"KV cache usage 0-1 as the watcher reads it (TGI: reserved batch tokens over the batch token capacity) and as vLLM exports it. Bands: the policy's levels ({bands}).",
            thresholds=level_steps,
            max_value=1,
        ),
        _level_timeline(2, (16, 0, 8, 9)),
        _timeseries(
            3,
            "Requests running and waiting",
            (0, 9, 8, 8),
            engine_queries("requests"),
            unit="short",
            description="A growing waiting queue is the queue_growth signal; vLLM's KV guard queues here instead of preempting. vLLM also says how many wait for KV or batch room (reason capacity).",
        ),
        _timeseries(
            4,
            "Preemptions per second",
            (8, 9, 8, 8),
            engine_queries("preemptions"),
            unit="short",
            description="vLLM preempts the newest request when the KV pool runs out and recomputes it later (the preemptions signal). TGI never preempts.",
        ),
        _timeseries(
            5,
            "Generation throughput",
            (16, 9, 8, 8),
            engine_queries("throughput"),
            unit="short",
            description="vLLM: generated tokens per second. TGI exports no token counter: decode steps per second (each step adds one token to every running request).",
        ),
        _timeseries(
            6,
            "Admission: requests by level",
            (0, 17, 8, 8),
            [
                (f"sum by (level) (rate(kvops_proxy_requests_total{{{KVOPS}}}[{RATE}]))", "{{level}} (proxy)"),
                (
                    f"sum by (level) (rate(kvops_middleware_requests_total{{{ENGINE}}}[{RATE}]))",
                    "{{level}} (middleware)",
                ),
            ],
            unit="reqps",
            description="Requests through the admission proxy, and generation requests the engine's admission middleware saw, by the level in force when each arrived.",
        ),
        _timeseries(
            7,
            "Admission: clamps and rejections",
            (8, 17, 8, 8),
            [
                (f"sum by (field) (rate(kvops_proxy_clamped_total{{{KVOPS}}}[{RATE}]))", "clamped {{field}} (proxy)"),
                (f"sum(rate(kvops_proxy_rejected_total{{{KVOPS}}}[{RATE}]))", "rejected (proxy)"),
                (
                    f"sum by (field) (rate(kvops_middleware_clamped_total{{{ENGINE}}}[{RATE}]))",
                    "clamped {{field}} (middleware)",
                ),
                (
                    f"sum by (status) (rate(kvops_middleware_rejected_total{{{ENGINE}}}[{RATE}]))",
                    "rejected {{status}} (middleware)",
                ),
                *engine_queries("admission_rejections"),  # the engine's own queue limit (vLLM 0.32+)
            ],
            unit="reqps",
            description="Fields the proxy or the middleware changed (warn caps max new tokens, degrade forces n, best_of and beam width to 1) and requests refused: 429 for the sheddable from degrade, 503 at critical.",
        ),
        _timeseries(
            8,
            "Watcher: failed polls",
            (16, 17, 8, 8),
            [(f"sum by (instance) (rate(kvops_poll_failures_total{{{KVOPS}}}[{RATE}]))", "{{instance}}")],
            unit="short",
            description="Polls that gave no usable metrics (engine down, 500, timeout, garbage): the level turns unknown; KVMetricsStale alerts after the policy's stale_after_failures.",
        ),
        _timeseries(
            9,
            "KV demand against the pool",
            (0, 25, 8, 8),
            [
                (f"sum by (instance) ({DEMAND}{{{ENGINE}}})", "{{instance}} demand (rules)"),
                (f"sum by (instance) ({USABLE}{{{ENGINE}}})", "{{instance}} pool (rules)"),
                ("kvops_replica_kv_demand_tokens{" + KVOPS + "}", "{{instance}} demand (kvops watch)"),
            ],
            unit="short",
            description=f"KV tokens demanded, max(in use, running x R) + waiting x R, against the pool: what KEDA and the HPA scale on (kvops manifests --autoscale). Demand counts a request at R as soon as it is queued, before its blocks fill: it rises ahead of KV usage. Scale out when demand passes warn ({policy.thresholds[Level.WARN]:.0%}) of the pool.",
        ),
        _timeseries(
            10,
            "Prefix-cache hit rate",
            (8, 25, 8, 8),
            engine_queries("prefix_hit_rate"),
            unit="percentunit",
            description="Queried prompt tokens found in the prefix cache (the PrefixCacheHitRateLow signal alerts under its `below`, 85%). TGI exports no prefix-cache counter.",
            max_value=1,
        ),
        _timeseries(
            11,
            "GPU memory",
            (16, 25, 8, 8),
            [
                (f"max by (instance) ({GPU_MEMORY}{{{ENGINE}}})", "{{instance}} in use: weights, overheads, KV in use"),
                (
                    f"max by (Hostname, gpu) ({DCGM_USED} / ({DCGM_USED} + {DCGM_FREE}))",
                    "{{Hostname}} GPU {{gpu}} reserved (DCGM exporter)",
                ),
            ],
            unit="percentunit",
            description=f"Memory in use, from the plan's weights and overheads and the KV blocks in use (recorded by the rules of kvops alerts --plan), against the policy's gpu_memory.below ({policy.gpu_memory_below:.0%}); and, where NVIDIA's DCGM exporter runs, what the device reports: vLLM reserves its whole --gpu-memory-utilization at start, so that line stays flat.",
            thresholds=[(None, "green"), (policy.gpu_memory_below, "red")],
            max_value=1,
        ),
        _timeseries(
            12,
            "Time to first token, p95",
            (0, 33, 8, 8),
            engine_queries("ttft"),
            unit="s",
            description="vLLM's time to first token (queue, prefill and the first decode step). TGI exports no time to first token: its queue time.",
        ),
        _timeseries(
            13,
            "Time per output token, p95",
            (8, 33, 8, 8),
            engine_queries("tpot"),
            unit="s",
            description="vLLM's inter-token latency: the time between two tokens of a request, which grows with the batch.",
        ),
        _timeseries(
            14,
            "Host KV tier",
            (16, 33, 8, 8),
            [*engine_queries("offload_usage"), *engine_queries("offload_load")],
            unit="percentunit",
            description="vLLM's host (CPU) KV tier (--kv-offloading-size): the share pinned by transfers (KVOffloadSaturated alerts above 95%), and the time per load back to the GPU (KVOffloadLoadSlow alerts above 5 ms), on the right axis. Empty without a tier.",
            seconds_from=len(engine_queries("offload_usage")),
        ),
    ]
    document = {
        "title": "kvops: KV cache pressure",
        "uid": "kvops",
        "description": f"Generated by `kvops dashboard` from the policy ({bands}); regenerate rather than edit.",
        "tags": ["kvops", "vllm", "tgi"],
        "editable": True,
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "hide": 0},
                {
                    "name": "job",
                    "label": "engine job",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "definition": JOBS_QUERY,
                    "query": JOBS_QUERY,
                    "regex": JOBS_REGEX,
                    "refresh": 2,
                    "sort": 1,
                    "multi": True,
                    "includeAll": True,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "hide": 0,
                    "description": "The engine's Prometheus job, from the sidecars' jobs (kvops-<job>): every deployment's name.",
                },
                {
                    "name": "namespace",
                    "label": "namespace",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "definition": NAMESPACES_QUERY,
                    "query": NAMESPACES_QUERY,
                    "refresh": 2,
                    "sort": 1,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "hide": 0,
                    "description": "The Kubernetes namespaces those jobs run in (none under compose): a deployment's name "
                    "can be in several, and the panels that sum over replicas would mix them.",
                },
            ]
        },
        "panels": panels,
    }
    return json.dumps(document, indent=2) + "\n"


def queries(document: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard."""
    return [target["expr"] for panel in document["panels"] for target in panel.get("targets", [])]


def _targets(exprs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {"refId": _ref(index), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
        for index, (expr, legend) in enumerate(exprs)
    ]


def _timeseries(
    panel_id: int,
    title: str,
    position: tuple[int, int, int, int],
    exprs: list[tuple[str, str]],
    *,
    unit: str,
    description: str,
    thresholds: list[tuple[float | None, str]] | None = None,
    max_value: float | None = None,
    seconds_from: int | None = None,
) -> dict[str, Any]:
    """A time series panel; with `seconds_from`, the queries from that index on are seconds on the right axis."""
    defaults: dict[str, Any] = {"unit": unit, "min": 0, "custom": {"fillOpacity": 10, "showPoints": "never"}}
    if max_value is not None:
        defaults["max"] = max_value
    if thresholds:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": color, "value": value} for value, color in thresholds],
        }
        defaults["custom"]["thresholdsStyle"] = {"mode": "line+area"}
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": _grid(position),
        "fieldConfig": {"defaults": defaults, "overrides": _seconds(len(exprs), seconds_from)},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": _targets(exprs),
    }


def _seconds(count: int, start: int | None) -> list[dict[str, Any]]:
    """Overrides that put the queries from `start` on in seconds, on the right axis (no maximum)."""
    if start is None:
        return []
    return [
        {
            "matcher": {"id": "byFrameRefID", "options": _ref(index)},
            "properties": [
                {"id": "unit", "value": "s"},
                {"id": "max"},
                {"id": "custom.axisPlacement", "value": "right"},
            ],
        }
        for index in range(start, count)
    ]


def _ref(index: int) -> str:
    return chr(ord("A") + index)


def _level_timeline(panel_id: int, position: tuple[int, int, int, int]) -> dict[str, Any]:
    mappings = {
        str(int(level)): {"text": level.label, "color": BAND_COLORS[level], "index": index}
        for index, level in enumerate(sorted(Level))
    }
    return {
        "id": panel_id,
        "type": "state-timeline",
        "title": "Level",
        "datasource": DATASOURCE,
        "gridPos": _grid(position),
        "description": "The watcher's level per sidecar (the worst of its replicas): what the proxy and the KV guard apply.",
        "fieldConfig": {
            "defaults": {
                "mappings": [{"type": "value", "options": mappings}],
                "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": [{"color": "text", "value": None}]},
            },
            "overrides": [],
        },
        "options": {"showValue": "auto", "mergeValues": True, "legend": {"showLegend": False}},
        "targets": _targets([("kvops_level{" + KVOPS + "}", "{{instance}}")]),
    }


def _grid(position: tuple[int, int, int, int]) -> dict[str, int]:
    x, y, w, h = position
    return {"x": x, "y": y, "w": w, "h": h}
