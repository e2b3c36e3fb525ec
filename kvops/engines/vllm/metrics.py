"""vLLM's /metrics (V1 engine, `vllm/v1/metrics/loggers.py`): the names the watcher reads and what they mean.

`vllm:kv_cache_usage_perc` is a 0-1 fraction of the KV blocks in use (idle prefix-cached blocks count as free).
Older releases exported it as `vllm:gpu_cache_usage_perc`, deprecated in favour of the new name and since removed;
it is read when the new name is absent. Counters carry prometheus_client's `_total` suffix. Every series is
labelled `model_name` and `engine` (one per data-parallel engine): counts are summed over them, usage is the
highest; the tokens in use are each engine's usage times its pool (`vllm:cache_config_info`), summed.

The host (CPU) KV tier, with `--kv-offloading-size` (vLLM's native OffloadingConnector,
`vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py` and `vllm/v1/kv_offload/cpu/spec.py`):
`vllm:kv_offload_cpu_cache_usage_perc` (the share of the tier pinned by transfers in flight), and per transfer
direction the bytes and seconds moved (`vllm:kv_offload_load_bytes`/`_load_time`, GPU<-CPU; `_store_*`, GPU->CPU)
with a histogram of each transfer's size, whose `_count` counts the transfers. 0.32.0 still exports the older
`vllm:kv_offload_total_bytes`/`_total_time`/`_size{transfer_type="CPU_to_GPU"|"GPU_to_CPU"}` beside them, marked
deprecated: they are read when the new names are absent. The tier's capacity is not exported before 0.33
(vllm-project/vllm#49307; `cache_config_info` states its size in GiB, `kv_offloading_size`); from 0.33
`vllm:kv_offload_config_info` states its tokens (`cpu_kv_cache_size_tokens`).

Added in 0.32-0.34 and read here: `vllm:admission_rejections{reason}` (requests vLLM's own queue limit refused with
503), `vllm:num_requests_waiting_by_reason{reason="capacity"}`, `vllm:prompt_tokens_cached_by_source{source}`.
`vllm:watermark_requests` counts output-text watermarking, never KV headroom: it is not read, and `kvops lint`
says so where a file reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvops.engines.metrics import Catalogue, MetricsError, PromQL, Reading, Retired, Samples, series, usage_fraction
from kvops.frozen import frozen

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_REMOVED = "vllm:gpu_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
CACHE_CONFIG = "vllm:cache_config_info"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # reason = capacity | deferred
OFFLOAD_USAGE = "vllm:kv_offload_cpu_cache_usage_perc"
OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
OFFLOAD_LOAD_SECONDS = "vllm:kv_offload_load_time_total"
OFFLOAD_LOADS = "vllm:kv_offload_load_size_count"  # the histogram of load sizes counts the loads
# deprecated in 0.32.0, read when the names above are absent: one series per direction
OFFLOAD_BYTES_DEPRECATED = "vllm:kv_offload_total_bytes_total"
OFFLOAD_SECONDS_DEPRECATED = "vllm:kv_offload_total_time_total"
OFFLOAD_TRANSFERS_DEPRECATED = "vllm:kv_offload_size_count"
LOAD_DIRECTION = {"transfer_type": "CPU_to_GPU"}
# added in 0.32-0.34 (vllm/v1/metrics/loggers.py l.548, l.782, l.848 and offloading/metrics.py l.27, 0.34.0 wheel)
ADMISSION_REJECTIONS = "vllm:admission_rejections_total"  # reason = max_num_queued_reqs | max_num_queued_tokens (0.32)
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"  # source = device | host | disk | p2p | ... (0.32)
OFFLOAD_CONFIG = "vllm:kv_offload_config_info"  # cpu_num_chunks, cpu_blocks_per_chunk, cpu_kv_cache_size_tokens (0.33)
# output-text watermarking (only with watermark_config), by status: nothing to do with --watermark's KV headroom
WATERMARK_REQUESTS = "vllm:watermark_requests"
TTFT = "vllm:time_to_first_token_seconds"
INTER_TOKEN = "vllm:inter_token_latency_seconds"

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
    WAITING_BY_REASON,
    OFFLOAD_USAGE,
    OFFLOAD_LOAD_BYTES,
    OFFLOAD_LOAD_SECONDS,
    OFFLOAD_LOADS,
    OFFLOAD_BYTES_DEPRECATED,
    OFFLOAD_SECONDS_DEPRECATED,
    OFFLOAD_TRANSFERS_DEPRECATED,
    ADMISSION_REJECTIONS,
    CACHED_BY_SOURCE,
    OFFLOAD_CONFIG,
)


def reading(samples: Samples, capacity_tokens: int | None = None) -> Reading:
    """The replica's KV usage and saturation counters; MetricsError when the usage gauge is missing or unusable."""
    usage, basis = samples.highest(KV_USAGE), KV_USAGE
    if usage is None:
        usage, basis = samples.highest(KV_USAGE_REMOVED), f"{KV_USAGE_REMOVED} (removed alias)"
    if usage is None:
        raise MetricsError(_missing(samples))
    name = basis.split()[0]
    usage = usage_fraction(name, usage)
    config = cache_config(samples)
    pool = capacity_tokens or (config.capacity_tokens if config else None)
    usable = config.usable_tokens if config else None
    ranks = [usage_fraction(name, s.value) for s in samples.series(name)]
    return Reading(
        kv_usage=usage,
        basis=basis,
        running=samples.total(RUNNING),
        waiting=samples.total(WAITING),
        preemptions_total=samples.total(PREEMPTIONS),
        progress_total=samples.total(GENERATION_TOKENS),
        prefix_hits_total=samples.total(PREFIX_HITS),
        prefix_queries_total=samples.total(PREFIX_QUERIES),
        capacity_tokens=pool * len(ranks) if pool else None,
        block_size=config.integer("block_size") if config else None,
        usable_tokens=usable * len(ranks) if usable else None,
        used_tokens=sum(ranks) * usable if usable else None,
        max_model_len=config.max_model_len if config else None,
        waiting_for_capacity=samples.total(WAITING_BY_REASON, reason="capacity"),
        admission_rejections_total=samples.total(ADMISSION_REJECTIONS),
        offload_capacity_tokens=_offload_capacity(samples),
        cached_tokens_by_source=_cached_by_source(samples),
        **_offload(samples),
    )


def _offload_capacity(samples: Samples) -> int | None:
    """The host KV tier's tokens (`vllm:kv_offload_config_info` cpu_kv_cache_size_tokens, per engine, summed; 0.33+:
    vllm/v1/kv_offload/cpu/common.py), None before 0.33 or without a tier."""
    sizes = [found.labels.get("cpu_kv_cache_size_tokens", "") for found in samples.series(OFFLOAD_CONFIG)]
    counts = [int(size) for size in sizes if size.isascii() and size.isdigit() and len(size) <= 18]
    return sum(counts) if counts else None


def _cached_by_source(samples: Samples) -> dict[str, float] | None:
    """Prefix-cache hit tokens by the tier that supplied them (device, host, disk, p2p), summed over engines."""
    found: dict[str, float] = {}
    for sample in samples.series(CACHED_BY_SOURCE):
        source = sample.labels.get("source", "")
        found[source] = found.get(source, 0.0) + sample.value
    return found or None


def _offload(samples: Samples) -> dict[str, float | None]:
    """The host KV tier's usage and loads; all None when the engine runs without one."""
    usage = samples.highest(OFFLOAD_USAGE)
    seconds, loads = samples.total(OFFLOAD_LOAD_SECONDS), samples.total(OFFLOAD_LOADS)
    loaded = samples.total(OFFLOAD_LOAD_BYTES)
    if seconds is None:
        seconds = samples.total(OFFLOAD_SECONDS_DEPRECATED, **LOAD_DIRECTION)
        loads = samples.total(OFFLOAD_TRANSFERS_DEPRECATED, **LOAD_DIRECTION)
        loaded = samples.total(OFFLOAD_BYTES_DEPRECATED, **LOAD_DIRECTION)
    return {
        "offload_usage": None if usage is None else usage_fraction(OFFLOAD_USAGE, usage),
        "offload_load_seconds_total": seconds,
        "offload_loads_total": loads,
        "offload_load_bytes_total": loaded,
    }


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
        offload_usage=of(OFFLOAD_USAGE),
        offload_load_seconds_increase=(
            f"(increase({of(OFFLOAD_LOAD_SECONDS)}[$window]) or ignoring (transfer_type) "
            f"increase({series(OFFLOAD_SECONDS_DEPRECATED, matchers, **LOAD_DIRECTION)}[$window]))"
        ),
        offload_loads_increase=(
            f"(increase({of(OFFLOAD_LOADS)}[$window]) or ignoring (transfer_type) "
            f"increase({series(OFFLOAD_TRANSFERS_DEPRECATED, matchers, **LOAD_DIRECTION)}[$window]))"
        ),
        refusals_increase=f"sum without (reason) (increase({of(ADMISSION_REJECTIONS)}[$window]))",
        matchers=tuple(matchers),
    )


@frozen
class CacheConfig:
    """The labels of `vllm:cache_config_info`: every CacheConfig field of the running engine, as strings
    (absent before the engine is up)."""

    labels: Mapping[str, str]

    def get(self, name: str) -> str | None:
        return self.labels.get(name)

    def integer(self, name: str) -> int | None:
        value = self.labels.get(name)
        # labels are the scraped text: ASCII digits, short enough to be a real count (int() refuses 4,300 digits)
        return int(value) if value and value.isascii() and value.isdigit() and len(value) <= 18 else None

    def number(self, name: str) -> float | None:
        try:
            value = float(self.labels[name])
        except (KeyError, ValueError):
            return None
        return value if math.isfinite(value) else None  # "NaN" and "+Inf" parse as floats

    @property
    def capacity_tokens(self) -> int | None:
        """The KV pool in tokens: `kv_cache_size_tokens`, else num_gpu_blocks x block_size."""
        blocks, block_size = self.integer("num_gpu_blocks"), self.integer("block_size")
        return self.integer("kv_cache_size_tokens") or (blocks * block_size if blocks and block_size else None)

    @property
    def usable_tokens(self) -> int | None:
        """The tokens `vllm:kv_cache_usage_perc` is a fraction of: the pool less its null block
        (vllm/v1/core/block_pool.py, get_usage: 1 - free / (num_gpu_blocks - 1))."""
        tokens, blocks = self.capacity_tokens, self.integer("num_gpu_blocks")
        return tokens * (blocks - 1) // blocks if tokens and blocks else None

    @property
    def max_model_len(self) -> int | None:
        """The engine's context: `kv_cache_size_tokens` is int(kv_cache_max_concurrency x max-model-len)
        (vllm/v1/core/kv_cache_utils.py, get_kv_cache_capacity)."""
        tokens, concurrency = self.integer("kv_cache_size_tokens"), self.number("kv_cache_max_concurrency")
        return round(tokens / concurrency) if tokens and concurrency and concurrency >= 1e-9 else None


def usage_pool_tokens(capacity: Mapping[str, Any]) -> int:
    """From a plan's capacity (`kvops plan --json`), the tokens the usage gauge is a fraction of: the pool less
    its null block."""
    return int(capacity["kv_tokens"]) * int(capacity["usable_blocks"]) // int(capacity["num_blocks"])


def cache_config(samples: Samples) -> CacheConfig | None:
    found = samples.series(CACHE_CONFIG)
    return CacheConfig(found[0].labels) if found else None


def _missing(samples: Samples) -> str:
    if not samples.seen:
        return f"no samples at all (expected {KV_USAGE})"
    renamed = sorted(name for name in samples.seen if "kv_cache" in name or "cache_usage" in name)
    hint = f"; found {', '.join(renamed)}: renamed?" if renamed else ": not a vLLM /metrics, or the metric was renamed"
    return f"no {KV_USAGE} (nor the removed {KV_USAGE_REMOVED}) among {len(samples.seen)} metric names{hint}"


# --- the Grafana dashboard's vLLM queries (kvops/deploy/grafana.py asks every engine for its own) ---------


CAPACITY_REASON = ',reason="capacity"'


def dashboard(selector: str, rate: str) -> dict[str, list[tuple[str, str]]]:
    """Panel key -> (PromQL, legend) of vLLM's series; `selector` is the matchers inside {}, `rate` a range."""

    def of(name: str, extra: str = "") -> str:
        return f"{name}{{{selector}{extra}}}"

    def per_second(name: str, extra: str = "") -> str:
        return f"sum by (instance) (rate({of(name, extra)}[{rate}]))"

    def p95(histogram: str) -> str:
        return f"histogram_quantile(0.95, sum by (instance, le) (rate({of(histogram + '_bucket')}[{rate}])))"

    return {
        "kv_usage": [(f"max by (job, instance) ({of(KV_USAGE)})", "{{instance}} vLLM")],
        "requests": [
            (f"sum by (instance) ({of(RUNNING)})", "{{instance}} running"),
            (f"sum by (instance) ({of(WAITING)})", "{{instance}} waiting"),
            (
                f"sum by (instance) ({of(WAITING_BY_REASON, CAPACITY_REASON)})",
                "{{instance}} waiting for KV or batch room",
            ),
        ],
        "preemptions": [(per_second(PREEMPTIONS), "{{instance}}")],
        "throughput": [(per_second(GENERATION_TOKENS), "{{instance}} tokens/s (vLLM)")],
        "prefix_hit_rate": [(f"{per_second(PREFIX_HITS)} / {per_second(PREFIX_QUERIES)}", "{{instance}} vLLM")],
        "ttft": [(p95(TTFT), "{{instance}} time to first token p95 (vLLM)")],
        "tpot": [(p95(INTER_TOKEN), "{{instance}} time per output token p95 (vLLM)")],
        "offload_usage": [(f"max by (instance) ({of(OFFLOAD_USAGE)})", "{{instance}} host tier pinned")],
        "offload_load": [
            (f"{per_second(OFFLOAD_LOAD_SECONDS)} / {per_second(OFFLOAD_LOADS)}", "{{instance}} time per load")
        ],
        "admission_rejections": [
            (
                f"sum by (reason) (rate({of(ADMISSION_REJECTIONS)}[{rate}]))",
                "refused by vLLM's {{reason}} (503, no Retry-After)",
            )
        ],
        "cached_by_source": [
            (f"sum by (source) (rate({of(CACHED_BY_SOURCE)}[{rate}]))", "cached tokens from {{source}}")
        ],
    }


# --- what vLLM 0.32.0 exports and what it retired, for `kvops lint` ----------------------------------------
# Exported: every family the installed 0.32.0 package registers (vllm/v1/metrics/loggers.py, vllm/v1/kv_offload/,
# vllm/distributed/kv_transfer/kv_connector/v1/*/metrics.py and the server's own). Retired: vLLM's policy is
# "deprecated in X.Y, hidden in X.Y+1 (--show-hidden-metrics-for-version=X.Y brings them back), removed in X.Y+2".

RELEASE = "0.34"
_V08 = ("0.8", "0.9", "0.10", "vllm-project/vllm#14136, hidden #15458, removed #18837")
_V010 = ("0.10", "0.11", "0.12", "vllm-project/vllm#18354, hidden #24245, removed #29330")
_V032 = ("0.32", "0.33", "0.34", "vllm 0.32.0 offloading/metrics.py (_DEPRECATED_CONNECTOR_METRIC_DEFINITIONS)")
_RETIRED = {
    "vllm:gpu_cache_usage_perc": ("vllm:kv_cache_usage_perc", _V010),
    "vllm:gpu_prefix_cache_queries": ("vllm:prefix_cache_queries", _V010),
    "vllm:gpu_prefix_cache_hits": ("vllm:prefix_cache_hits", _V010),
    "vllm:time_per_output_token_seconds": (
        "vllm:inter_token_latency_seconds",
        ("0.11", "0.12", "0.13", "vllm-project/vllm#24110, hidden #29330"),
    ),
    "vllm:num_requests_swapped": (None, _V08),
    "vllm:cpu_cache_usage_perc": (None, _V08),
    "vllm:cpu_prefix_cache_hit_rate": (None, _V08),
    "vllm:gpu_prefix_cache_hit_rate": ("vllm:prefix_cache_hits / vllm:prefix_cache_queries", _V08),
    "vllm:time_in_queue_requests": ("vllm:request_queue_time_seconds", _V08),
    "vllm:model_forward_time_milliseconds": (None, _V08),
    "vllm:model_execute_time_milliseconds": (None, _V08),
    "vllm:kv_offload_total_bytes": ("vllm:kv_offload_load_bytes and vllm:kv_offload_store_bytes", _V032),
    "vllm:kv_offload_total_time": ("vllm:kv_offload_load_time and vllm:kv_offload_store_time", _V032),
    "vllm:kv_offload_size": ("vllm:kv_offload_load_size and vllm:kv_offload_store_size", _V032),
}
_EXPORTED = """
admission_rejections cache_config_info corrupted_requests diffusion_num_canvas_positions
diffusion_num_committed_tokens diffusion_num_denoising_steps e2e_request_latency_seconds engine_sleep_state
estimated_flops_per_gpu_total estimated_read_bytes_per_gpu_total estimated_write_bytes_per_gpu_total
external_prefix_cache_hits external_prefix_cache_queries generation_tokens hisparse_cache_hits hisparse_cache_misses
hisparse_host_block_idle_before_evict_seconds hisparse_host_block_lifetime_seconds
hisparse_host_block_reuse_gap_seconds hisparse_host_cache_usage_perc hisparse_host_to_device_bytes
hisparse_pending_page_transfers inter_token_latency_seconds iteration_tokens_total kv_block_idle_before_evict_seconds
kv_block_lifetime_seconds kv_block_reuse_gap_seconds kv_cache_usage_perc kv_offload_allocation_failure
kv_offload_cpu_allocation_size kv_offload_cpu_cache_read_usage_perc kv_offload_cpu_cache_usage_perc
kv_offload_cpu_cache_write_usage_perc kv_offload_load_bytes kv_offload_load_size kv_offload_load_time
kv_offload_lookup_async_delay_seconds kv_offload_lookup_sync_delay_seconds kv_offload_store_bytes
kv_offload_store_size kv_offload_store_time kv_offload_stores_skipped lora_requests_info mm_cache_hits
mm_cache_queries num_preemptions num_requests_kv_fetch_by_stage num_requests_running num_requests_waiting
num_requests_waiting_by_reason prefix_cache_hits prefix_cache_queries prompt_tokens prompt_tokens_by_source
prompt_tokens_cached prompt_tokens_cached_by_source request_decode_time_seconds request_generation_tokens
request_inference_time_seconds request_max_num_generation_tokens request_num_preemptions request_params_max_tokens
request_params_n request_prefill_kv_computed_tokens request_prefill_time_seconds request_prompt_tokens
request_queue_time_seconds request_success request_time_per_output_token_seconds spec_decode_num_accepted_tokens
spec_decode_num_accepted_tokens_per_pos spec_decode_num_draft_tokens spec_decode_num_drafts
time_to_first_token_seconds watermark_requests nixl_bytes_transferred nixl_num_descriptors
nixl_num_failed_notifications nixl_num_failed_transfers nixl_num_kv_expired_reqs nixl_num_notifications_after_expiry
nixl_post_time_seconds nixl_xfer_time_seconds
hf3fs_load_duration_seconds hf3fs_num_failed_load hf3fs_num_failed_save hf3fs_save_duration_seconds
kv_offload_config_info kv_offload_tiering_active_cascade_jobs kv_offload_tiering_active_promotion_jobs
kv_offload_tiering_backpressure_blocks_dropped kv_offload_tiering_backpressure_store_latency_ema
kv_offload_tiering_backpressure_stores_dropped kv_offload_tiering_cascade_job_failures kv_offload_tiering_chunk_hits
kv_offload_tiering_chunk_queries kv_offload_tiering_deferred_release_chunks
kv_offload_tiering_deferred_release_hold_seconds kv_offload_tiering_lookup_async_delay_seconds
kv_offload_tiering_lookup_sync_delay_seconds kv_offload_tiering_primary_read_usage_perc
kv_offload_tiering_primary_write_usage_perc kv_offload_tiering_promotion_allocation_failures
kv_offload_tiering_promotion_job_failures kv_offload_tiering_promotion_latency_seconds kv_offload_tiering_read_bytes
kv_offload_tiering_read_time kv_offload_tiering_write_bytes kv_offload_tiering_write_time mooncake_bytes_transferred
mooncake_num_descriptors mooncake_num_failed_recvs mooncake_num_failed_transfers mooncake_num_kv_expired_reqs
mooncake_store_operation_bytes_total mooncake_store_operation_failed_keys_total mooncake_store_operation_keys_total
mooncake_store_operation_time_seconds mooncake_store_operation_total mooncake_xfer_time_seconds
request_render_duration_seconds rl_weight_update_operation_duration_seconds rl_weight_update_operations_in_flight
simple_kv_offload_info simple_kv_offload_load_blocks_total simple_kv_offload_pending_store_blocks
simple_kv_offload_save_outcomes_total simple_kv_offload_used_blocks sleep_mode_operation_duration_seconds
sleep_mode_operations_in_flight tool_call_parser_invocations_total umbp_transfer_bytes_total
umbp_transfer_completed_total umbp_transfer_failed_total umbp_transfer_submitted_total
websocket_connection_duration_seconds websocket_connections_active websocket_connections_total
"""
# the families the 0.33.0 and 0.34.0 wheels add: every "vllm:..." name registered under vllm/ (no family removed
# since 0.30: the set difference of the two wheels' names is empty)
# vLLM production-stack's router exports these under vLLM's prefix (src/vllm_router/services/metrics_service/)
_ROUTER = """
current_qps avg_decoding_length num_prefill_requests num_decoding_requests num_incoming_requests healthy_pods_total
avg_latency avg_itl input_tokens_total output_tokens_total request_errors_total request_latency_seconds
"""

CATALOGUE = Catalogue(
    engine="vllm",
    release=RELEASE,
    pattern=r"vllm:[A-Za-z_][A-Za-z0-9_:]*",
    exported=frozenset(f"vllm:{name}" for name in _EXPORTED.split()),
    retired={
        name: Retired(replacement, deprecated, hidden, removed, source)
        for name, (replacement, (deprecated, hidden, removed, source)) in _RETIRED.items()
    },
    others={f"vllm:{name}": "vLLM production-stack's router" for name in _ROUTER.split()},
    misread={
        WATERMARK_REQUESTS: (
            "counts finished requests by output-text watermark status (only with watermark_config, "
            "vllm/v1/metrics/loggers.py l.643), not --watermark's KV headroom: read vllm:kv_cache_usage_perc, or "
            "the blocks vllm:cache_config_info states"
        )
    },
)
