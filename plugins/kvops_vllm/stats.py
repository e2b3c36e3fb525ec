"""The KV usage vLLM's API server process already holds, read in-process: no HTTP call, no registration.

In vLLM 0.32.0 to 0.34.0 (tests/engine/test_middleware_release.py runs each release's stat logger) the API server's
output handler (`vllm/v1/engine/async_llm.py`, `output_handler`) hands the
`SchedulerStats` of each `EngineCoreOutputs` it receives to its `StatLoggerManager`, whose `PrometheusStatLogger`
sets `vllm:kv_cache_usage_perc` per engine (`vllm/v1/metrics/loggers.py`, `record`:
`gauge_kv_cache_usage[engine_idx].set(scheduler_stats.kv_cache_usage)`), on the event loop the middleware runs on.
Reading that gauge's children costs a dict lookup and a lock per request. A `vllm.stat_logger_plugins` entry point
(`vllm/plugins/__init__.py`) would see the same `SchedulerStats`, but only where kvops is pip-installed with its
package metadata (not from the PYTHONPATH copy `kvops manifests` gives the official image), and it would load into
every vLLM started in that environment.

The gauge holds the usage as of the last step whose stats reached this process: with one API server, every step's
(the engine core sends stats whenever logging is on, the default); with `--api-server-count > 1`, only the steps
whose stats the engine core sent to this one (`vllm/v1/core/sched/scheduler.py`, `update_from_output`: "Return stats
to only one of the front-ends"), see docs/kv-guard.md.
"""

from __future__ import annotations

from typing import Any

KV_USAGE = "vllm:kv_cache_usage_perc"  # kvops.engines.vllm.metrics.KV_USAGE


class GaugeUsage:
    """The highest `vllm:kv_cache_usage_perc` over this process's engines (data-parallel engines are children
    labelled `engine`; the watcher reads /metrics the same way), or None while the gauge is not registered."""

    def __init__(self, registry: Any = None, name: str = KV_USAGE):
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        self.registry = registry
        self.name = name

    def registered(self) -> bool:
        return self._gauge() is not None

    def _gauge(self) -> Any:
        # vLLM itself walks the registry's private maps (vllm/v1/metrics/prometheus.py, unregister_vllm_metrics);
        # the lookup is repeated each time because vLLM re-creates its gauges when a stat logger is rebuilt.
        return self.registry._names_to_collectors.get(self.name)

    def __call__(self) -> float | None:
        gauge = self._gauge()
        children = getattr(gauge, "_metrics", None)
        if not children:
            return None
        if len(children) == 1:
            for child in children.values():
                return float(child._value.get())
        return max(float(child._value.get()) for child in list(children.values()))
