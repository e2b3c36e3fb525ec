"""TGI's /metrics (v3 router, `backends/v3/src/{backend,queue}.rs`) and how KV usage is derived from it.

TGI exports no KV-cache gauge (huggingface/text-generation-inference#3275). Its router reserves KV slots for
every running request up front (input + max_new_tokens, in chunks of at most 1024) and reports the running
batch's reservation as `tgi_batch_current_max_tokens`; the pool those slots come from is `max_batch_total_tokens`,
which the router logs once at startup ("Setting max batch total tokens to N") and never exports (its
`tgi_batch_max_total_tokens` gauge is set before the metrics recorder is installed). So:

    kv_usage = tgi_batch_current_max_tokens / max_batch_total_tokens

with the capacity from `--max-batch-total-tokens N`, a kvops plan file, or that startup log line. Blocks held only
by the prefix-cache trie are not counted. TGI never preempts (requests wait in the queue instead), so there is
no preemption signal; decode steps (`tgi_batch_inference_count{method="decode"}`) stand in for generated tokens.
Counters have no `_total` suffix (the Rust `metrics-exporter-prometheus` writes names as given), and a metric
appears only once it is first touched: until a first batch has run, the batch gauges are absent, which reads as 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvops.engines.metrics import Catalogue, MetricsError, PromQL, Reading, Samples, series
from kvops.errors import UsageError

QUEUE_SIZE = "tgi_queue_size"
BATCH_SIZE = "tgi_batch_current_size"
BATCH_MAX_TOKENS = "tgi_batch_current_max_tokens"
INFERENCE_COUNT = "tgi_batch_inference_count"  # counter, label method = prefill | decode
INFERENCE_SUCCESS = (
    "tgi_batch_inference_success"  # counter, bumped when a prefill returns, just before the gauges are set
)

SERIES = (QUEUE_SIZE, BATCH_SIZE, BATCH_MAX_TOKENS, INFERENCE_COUNT, INFERENCE_SUCCESS)

CAPACITY_LOG_LINE = re.compile(r"Setting max batch total tokens to (\d{1,18})\b")


PREFIX = "tgi_"  # every series the router exports
# The batch's max_tokens is its requests' block tables summed (server/text_generation_server/models/flash_causal_lm.py,
# FlashCausalLMBatch.from_pb and to_pb, TGI 2.x-3.3.7): a prompt block shared through the prefix cache (on by default
# from 3.0) counts once per request holding it, so the gauge can pass the pool; it then reads as full, the side that
# promises less, where an error would leave the replica's level unknown while it serves.
OVER_COUNTED = "TGI counts a block the prefix cache shares once per request that holds it; is the capacity right?"


def reading(samples: Samples, capacity_tokens: int | None = None) -> Reading:
    if capacity_tokens is None:
        raise MetricsError("TGI's KV usage needs the batch token capacity (max_batch_total_tokens)")
    foreign = sorted(name for name in samples.seen if not name.startswith(PREFIX))
    if foreign and len(foreign) == len(samples.seen):  # an empty body is a router that has served nothing yet
        raise MetricsError(
            f"no {PREFIX}* metric among {len(samples.seen)} metric names (found {', '.join(foreign[:2])}, ...): "
            "not a TGI /metrics; is --engine right?"
        )
    reserved = samples.total(BATCH_MAX_TOKENS)
    if reserved is None and samples.total(INFERENCE_SUCCESS) is None:
        return Reading(
            kv_usage=0.0,
            basis=f"no batch has run yet ({INFERENCE_SUCCESS} and {BATCH_MAX_TOKENS} absent)",
            capacity_tokens=capacity_tokens,
            usable_tokens=capacity_tokens,
            used_tokens=0.0,
        )
    if reserved is None:
        raise MetricsError(
            f"no {BATCH_MAX_TOKENS} among {len(samples.seen)} metric names: not a TGI /metrics, or the metric was renamed"
        )
    if reserved < 0:
        raise MetricsError(f"{BATCH_MAX_TOKENS} {reserved:g} is below 0: not a TGI /metrics?")
    basis = f"{BATCH_MAX_TOKENS} {reserved:g} / {capacity_tokens} max batch total tokens"
    if reserved > capacity_tokens:
        basis += f" (read as full: {OVER_COUNTED})"
    return Reading(
        kv_usage=min(reserved / capacity_tokens, 1.0),
        basis=basis,
        running=samples.total(BATCH_SIZE),
        waiting=samples.total(QUEUE_SIZE),
        progress_total=samples.total(INFERENCE_COUNT, method="decode"),
        capacity_tokens=capacity_tokens,
        usable_tokens=capacity_tokens,
        used_tokens=reserved,
    )


def usage_pool_tokens(capacity: Mapping[str, Any]) -> int:
    """From a plan's capacity (`kvops plan --json`), the tokens the usage is a fraction of: the batch token capacity."""
    return int(capacity["kv_tokens"])


def promql(matchers: list[str], capacity_tokens: int | None = None) -> PromQL:
    if capacity_tokens is None:
        raise UsageError(
            "TGI's KV usage needs the batch token capacity: give --max-batch-total-tokens N, --plan FILE or --startup-log FILE"
        )
    return PromQL(
        usage=f"({series(BATCH_MAX_TOKENS, matchers)} / {capacity_tokens})",
        up=series("up", matchers),
        running=series(BATCH_SIZE, matchers),
        waiting=series(QUEUE_SIZE, matchers),
        progress_increase=f"sum without (method) (increase({series(INFERENCE_COUNT, matchers, method='decode')}[$window]))",
        matchers=tuple(matchers),
    )


# --- the batch token capacity --------------------------------------------------------------------------


def capacity_from_log(path: str | Path) -> int:
    """The last "Setting max batch total tokens to N" in a TGI startup log (plain or --json-output)."""
    text = _read(path, "--startup-log")
    found = CAPACITY_LOG_LINE.findall(text)
    if not found:
        raise UsageError(
            f"--startup-log {path}: no line 'Setting max batch total tokens to N' (TGI logs it once warmup ends)"
        )
    return int(found[-1])


def capacity_from_plan(path: str | Path) -> int:
    """`max_batch_total_tokens` from a plan file: a key anywhere in the JSON, or the flag in a list of flags."""
    from kvops.files import load_json

    data = load_json(_read(path, "--plan"), f"--plan {path}", UsageError)  # bounded in depth: walked below
    values = set(_plan_values(data))
    if len(values) != 1:
        what = "no" if not values else f"conflicting ({', '.join(map(str, sorted(values)))})"
        raise UsageError(
            f"--plan {path}: {what} max_batch_total_tokens (a positive integer key, or --max-batch-total-tokens N in its flags)"
        )
    return values.pop()


def _plan_values(node: Any) -> list[int]:
    found: list[int] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("max_batch_total_tokens", "--max-batch-total-tokens") and _positive(value):
                found.append(int(value))
            else:
                found.extend(_plan_values(value))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            if isinstance(item, str) and item.startswith("--max-batch-total-tokens"):
                value = item.partition("=")[2] if "=" in item else (node[index + 1] if index + 1 < len(node) else None)
                if value is not None and _positive(value):
                    found.append(int(value))
            else:
                found.extend(_plan_values(item))
    elif isinstance(node, str) and "--max-batch-total-tokens" in node:
        found.extend(int(n) for n in re.findall(r"--max-batch-total-tokens[= ](\d{1,18})\b", node) if int(n) > 0)
    return found


def _positive(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 0 < value < 1 << 60
    return isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18 and int(value) > 0


def _read(path: str | Path, option: str) -> str:
    """A startup log or a plan: a regular file (a FIFO or a device is refused), bounded."""
    from kvops.files import LOG_LIMIT, read_text

    return read_text(path, option, LOG_LIMIT, UsageError)


# --- the Grafana dashboard's TGI queries (kvops/deploy/grafana.py asks every engine for its own) ----------

QUEUE_DURATION = "tgi_request_queue_duration"  # histogram, seconds (router/src/server.rs)
DECODE = ',method="decode"'


def dashboard(selector: str, rate: str) -> dict[str, list[tuple[str, str]]]:
    """Panel key -> (PromQL, legend) of TGI's series. TGI exports no KV gauge (the watcher's usage covers it), no
    preemption, prefix-cache or host-tier counters, and no time to first token: its queue time stands there."""

    def of(name: str, extra: str = "") -> str:
        return f"{name}{{{selector}{extra}}}"

    return {
        "requests": [
            (f"sum by (instance) ({of(BATCH_SIZE)})", "{{instance}} running (TGI batch)"),
            (f"sum by (instance) ({of(QUEUE_SIZE)})", "{{instance}} waiting (TGI queue)"),
        ],
        "throughput": [
            (
                f"sum by (instance) (rate({of(INFERENCE_COUNT, DECODE)}[{rate}]))",
                "{{instance}} decode steps/s (TGI)",
            )
        ],
        "ttft": [
            (
                f"histogram_quantile(0.95, sum by (instance, le) (rate({of(QUEUE_DURATION + '_bucket')}[{rate}])))",
                "{{instance}} queue time p95 (TGI)",
            )
        ],
    }


# --- what TGI exports, for `kvops lint` (router/src/server.rs, validation.rs, queue.rs, backends/v3/src/) -------
# TGI 3.3.7 (the release kvops deploys; TGI is in maintenance mode): nothing retired. `tgi_batch_total_tokens` is described but never
# set; `tgi_batch_max_total_tokens` is set before the recorder exists, so it is never exported either.

_EXPORTED = """
request_count request_success request_failure request_duration request_validation_duration request_queue_duration
request_inference_duration request_mean_time_per_token_duration request_generated_tokens request_input_length
request_max_new_tokens request_skipped_tokens queue_size batch_current_size batch_current_max_tokens batch_next_size
batch_concat batch_inference_count batch_inference_success batch_inference_failure batch_inference_duration
batch_forward_duration batch_decode_duration batch_filter_duration batch_concat_duration
"""
CATALOGUE = Catalogue(
    engine="tgi",
    release="3.3.7",
    pattern=r"\btgi_[a-z0-9_]+",
    exported=frozenset(f"tgi_{name}" for name in _EXPORTED.split()),
    retired={},
    others={},
)
