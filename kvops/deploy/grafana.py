"""The Grafana dashboard: KV usage on the policy's bands, the level, queue, preemptions, tokens per second, and
what the admission proxy did. Engine series are selected by `job=~"$job"`, the sidecar's by `job=~"kvops-$job"`
(the jobs `kvops manifests` scrapes them as); vLLM and TGI panels sit side by side, each empty for the other engine.
"""

from __future__ import annotations

import json
from typing import Any

from kvops.policy import GRADED, Level, Policy

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ENGINE = 'job=~"$job"'
KVOPS = 'job=~"kvops-$job"'
RATE = "$__rate_interval"
BAND_COLORS = {
    Level.OK: "green",
    Level.WARN: "yellow",
    Level.DEGRADE: "orange",
    Level.CRITICAL: "red",
    Level.UNKNOWN: "text",
}


def dashboard(policy: Policy) -> str:
    bands = ", ".join(f"{level.label} {policy.thresholds[level]:.0%}" for level in GRADED)
    panels = [
        _timeseries(
            1,
            "KV cache usage",
            (0, 0, 16, 9),
            [
                ("kvops_kv_cache_usage_ratio{" + KVOPS + "}", "{{instance}} kvops watch"),
                ("max by (job, instance) (vllm:kv_cache_usage_perc{" + ENGINE + "})", "{{instance}} vLLM"),
            ],
            unit="percentunit",
            description=f"KV cache usage 0-1 as the watcher reads it (TGI: reserved batch tokens over the batch token capacity) and as vLLM exports it. Bands: the policy's levels ({bands}).",
            thresholds=[(None, BAND_COLORS[Level.OK])]
            + [(policy.thresholds[level], BAND_COLORS[level]) for level in GRADED],
            max_value=1,
        ),
        _level_timeline(2, (16, 0, 8, 9)),
        _timeseries(
            3,
            "Requests running and waiting",
            (0, 9, 8, 8),
            [
                ("sum by (instance) (vllm:num_requests_running{" + ENGINE + "})", "{{instance}} running"),
                ("sum by (instance) (vllm:num_requests_waiting{" + ENGINE + "})", "{{instance}} waiting"),
                ("sum by (instance) (tgi_batch_current_size{" + ENGINE + "})", "{{instance}} running (TGI batch)"),
                ("sum by (instance) (tgi_queue_size{" + ENGINE + "})", "{{instance}} waiting (TGI queue)"),
            ],
            unit="short",
            description="A growing waiting queue is the queue_growth signal; vLLM's KV guard queues here instead of preempting.",
        ),
        _timeseries(
            4,
            "Preemptions per second",
            (8, 9, 8, 8),
            [
                (f"sum by (instance) (rate(vllm:num_preemptions_total{{{ENGINE}}}[{RATE}]))", "{{instance}}"),
            ],
            unit="short",
            description="vLLM preempts the newest request when the KV pool runs out and recomputes it later (the preemptions signal). TGI never preempts.",
        ),
        _timeseries(
            5,
            "Generation throughput",
            (16, 9, 8, 8),
            [
                (
                    f"sum by (instance) (rate(vllm:generation_tokens_total{{{ENGINE}}}[{RATE}]))",
                    "{{instance}} tokens/s (vLLM)",
                ),
                (
                    f'sum by (instance) (rate(tgi_batch_inference_count{{{ENGINE},method="decode"}}[{RATE}]))',
                    "{{instance}} decode steps/s (TGI)",
                ),
            ],
            unit="short",
            description="vLLM: generated tokens per second. TGI exports no token counter: decode steps per second (each step adds one token to every running request).",
        ),
        _timeseries(
            6,
            "Proxy: requests by level",
            (0, 17, 8, 8),
            [
                (f"sum by (level) (rate(kvops_proxy_requests_total{{{KVOPS}}}[{RATE}]))", "{{level}}"),
            ],
            unit="reqps",
            description="Requests through the admission proxy, by the level in force when each arrived.",
        ),
        _timeseries(
            7,
            "Proxy: clamps and rejections",
            (8, 17, 8, 8),
            [
                (f"sum by (field) (rate(kvops_proxy_clamped_total{{{KVOPS}}}[{RATE}]))", "clamped {{field}}"),
                (f"sum(rate(kvops_proxy_rejected_total{{{KVOPS}}}[{RATE}]))", "rejected (503)"),
            ],
            unit="reqps",
            description="Fields the proxy changed (warn caps max new tokens, degrade forces n, best_of and beam width to 1) and requests answered 503 at critical.",
        ),
        _timeseries(
            8,
            "Watcher: failed polls",
            (16, 17, 8, 8),
            [
                (f"sum by (instance) (rate(kvops_poll_failures_total{{{KVOPS}}}[{RATE}]))", "{{instance}}"),
            ],
            unit="short",
            description="Polls that gave no usable metrics (engine down, 500, timeout, garbage): the level turns unknown; KVMetricsStale alerts after the policy's stale_after_failures.",
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
                    "type": "custom",
                    "query": "vllm,tgi",
                    "multi": True,
                    "includeAll": True,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "hide": 0,
                    "description": "The engine's Prometheus job; the sidecar's is kvops-<job>.",
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
        {"refId": chr(ord("A") + index), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
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
) -> dict[str, Any]:
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
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": _targets(exprs),
    }


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
