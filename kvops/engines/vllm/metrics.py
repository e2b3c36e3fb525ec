"""vLLM's /metrics (V1 engine, `vllm/v1/metrics/loggers.py`): the names the watcher reads and what they mean.

`vllm:kv_cache_usage_perc` is a 0-1 fraction of the KV blocks in use (idle prefix-cached blocks count as free).
Older releases exported it as `vllm:gpu_cache_usage_perc`, deprecated in favour of the new name and since removed;
it is read when the new name is absent. Counters carry prometheus_client's `_total` suffix. Every series is
labelled `model_name` and `engine` (one per data-parallel engine): counts are summed over them, usage is the
highest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvops.engines.metrics import MetricsError, PromQL, Reading, Samples, series, usage_fraction

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_REMOVED = "vllm:gpu_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
CACHE_CONFIG = "vllm:cache_config_info"

# What a Prometheus source fetches for each replica.
SERIES = (
    KV_USAGE,
    KV_USAGE_REMOVED,
    RUNNING,
    WAITING,
    PREEMPTIONS,
    GENERATION_TOKENS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    CACHE_CONFIG,
)


def reading(samples: Samples, capacity_tokens: int | None = None) -> Reading:
    """The replica's KV usage and saturation counters; MetricsError when the usage gauge is missing or unusable."""
    usage, basis = samples.highest(KV_USAGE), KV_USAGE
    if usage is None:
        usage, basis = samples.highest(KV_USAGE_REMOVED), f"{KV_USAGE_REMOVED} (removed alias)"
    if usage is None:
        raise MetricsError(_missing(samples))
    config = cache_config(samples)
    return Reading(
        kv_usage=usage_fraction(basis.split()[0], usage),
        basis=basis,
        running=samples.total(RUNNING),
        waiting=samples.total(WAITING),
        preemptions_total=samples.total(PREEMPTIONS),
        progress_total=samples.total(GENERATION_TOKENS),
        prefix_hits_total=samples.total(PREFIX_HITS),
        prefix_queries_total=samples.total(PREFIX_QUERIES),
        capacity_tokens=capacity_tokens or (config.capacity_tokens if config else None),
        block_size=config.integer("block_size") if config else None,
    )


def promql(matchers: list[str], capacity_tokens: int | None = None) -> PromQL:
    def of(name: str) -> str:
        return series(name, matchers)

    return PromQL(
        usage=f"({of(KV_USAGE)} or {of(KV_USAGE_REMOVED)})",
        up=series("up", matchers),
        running=of(RUNNING),
        waiting=of(WAITING),
        progress_increase=f"increase({of(GENERATION_TOKENS)}[$window])",
        preemptions_increase=f"increase({of(PREEMPTIONS)}[$window])",
        prefix_hits_increase=f"increase({of(PREFIX_HITS)}[$window])",
        prefix_queries_increase=f"increase({of(PREFIX_QUERIES)}[$window])",
    )


@dataclass(frozen=True)
class CacheConfig:
    """The labels of `vllm:cache_config_info`: every CacheConfig field of the running engine, as strings
    (absent before the engine is up)."""

    labels: Mapping[str, str]

    def get(self, name: str) -> str | None:
        return self.labels.get(name)

    def integer(self, name: str) -> int | None:
        value = self.labels.get(name)
        return int(value) if value and value.isdigit() else None

    def number(self, name: str) -> float | None:
        try:
            return float(self.labels[name])
        except (KeyError, ValueError):
            return None

    @property
    def capacity_tokens(self) -> int | None:
        """The KV pool in tokens: `kv_cache_size_tokens`, else num_gpu_blocks x block_size."""
        blocks, block_size = self.integer("num_gpu_blocks"), self.integer("block_size")
        return self.integer("kv_cache_size_tokens") or (blocks * block_size if blocks and block_size else None)


def cache_config(samples: Samples) -> CacheConfig | None:
    found = samples.series(CACHE_CONFIG)
    return CacheConfig(found[0].labels) if found else None


def _missing(samples: Samples) -> str:
    if not samples.seen:
        return f"no samples at all (expected {KV_USAGE})"
    renamed = sorted(name for name in samples.seen if "kv_cache" in name or "cache_usage" in name)
    hint = f"; found {', '.join(renamed)}: renamed?" if renamed else ": not a vLLM /metrics, or the metric was renamed"
    return f"no {KV_USAGE} (nor the removed {KV_USAGE_REMOVED}) among {len(samples.seen)} metric names{hint}"
