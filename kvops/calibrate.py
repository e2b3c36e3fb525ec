"""Calibration: what a running or finished engine reported, against what the planner predicted, term by term.

Inputs are parsed elsewhere (engines/*/logs.py for startup logs; `cache_config_info` here for a live /metrics);
this module pairs each measured figure with the plan's and turns the measurements into a `Profile` that
`kvops plan --profile` uses in place of its estimates. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from math import ceil
from typing import Any

from kvops.engines.tgi.logs import TgiLog
from kvops.engines.vllm.logs import VllmLog
from kvops.plan import Plan
from kvops.profile import Profile

# vLLM --kv-cache-dtype spellings -> kvops KV dtype names
_VLLM_KV_DTYPES = {
    "auto": "auto",
    "bfloat16": "bf16",
    "float16": "fp16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "int8_per_token_head": "int8",
    "int4_per_token_head": "int4",
}
_TGI_KV_DTYPES = {"Fp8e4m3fn": "fp8_e4m3", "Fp8e5m2": "fp8_e5m2", "fp8_e4m3fn": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


@dataclass(frozen=True)
class Comparison:
    term: str
    unit: str  # "bytes", "tokens", "blocks", "x"
    predicted: float | None
    actual: float | None
    source: str  # the log line or metric it was read from

    @property
    def difference(self) -> float | None:
        if self.predicted is None or self.actual is None:
            return None
        return self.actual - self.predicted

    def to_dict(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "unit": self.unit,
            "predicted": self.predicted,
            "actual": self.actual,
            "difference": self.difference,
            "source": self.source,
        }


@dataclass
class Calibration:
    engine: str
    source: str
    rows: list[Comparison]
    profile: Profile
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "source": self.source,
            "comparisons": [row.to_dict() for row in self.rows],
            "profile": self.profile.to_dict(),
            "notes": self.notes,
        }


# --- /metrics -------------------------------------------------------------------------------------------

_INFO_LINE = re.compile(r"^vllm:cache_config_info\{(.*)\}\s+\S+\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def cache_config_info(metrics_text: str) -> dict[str, str] | None:
    """The labels of `vllm:cache_config_info` (every CacheConfig field as a string), or None when absent."""
    for line in metrics_text.splitlines():
        match = _INFO_LINE.match(line.strip())
        if match:
            return {
                name: value.replace('\\"', '"').replace("\\\\", "\\") for name, value in _LABEL.findall(match.group(1))
            }
    return None


def _label_int(labels: dict[str, str] | None, name: str) -> int | None:
    value = (labels or {}).get(name)
    return int(value) if value and value.isdigit() else None


def _label_float(labels: dict[str, str] | None, name: str) -> float | None:
    try:
        return float((labels or {})[name])
    except (KeyError, ValueError):
        return None


# --- vLLM -----------------------------------------------------------------------------------------------


def vllm_plan_options(log: VllmLog | None, labels: dict[str, str] | None) -> dict[str, Any]:
    """Plan options the run itself states (its non-default args, its cache config), to predict that very run."""
    args = log.args if log else {}
    options: dict[str, Any] = {}
    if args.get("model"):
        options["model"] = args["model"]
    length = (log.max_model_len if log else None) or args.get("max_model_len") or _labels_max_model_len(labels)
    if isinstance(length, int) and length > 0:
        options["max_model_len"] = length
    for key, option in (
        ("tensor_parallel_size", "tp"),
        ("max_num_batched_tokens", "batched_tokens"),
        ("max_num_seqs", "max_num_seqs"),
        ("block_size", "block_size"),
    ):
        if isinstance(args.get(key), int):
            options[option] = args[key]
    pinned = args.get("kv_cache_memory_bytes") or _label_int(labels, "kv_cache_memory_bytes")
    if pinned:
        options["kv_cache_memory_bytes"] = pinned
    util = (
        args.get("gpu_memory_utilization")
        or (log.get("gpu_memory_utilization") if log else None)
        or _label_float(labels, "gpu_memory_utilization")
    )
    if util:
        options["memory_fraction"] = float(util)
    dtype = args.get("kv_cache_dtype") or (labels or {}).get("cache_dtype")
    if dtype in _VLLM_KV_DTYPES:
        options["kv_dtype"] = _VLLM_KV_DTYPES[dtype]
    if args.get("enforce_eager"):
        options["enforce_eager"] = True
    if log and log.device:
        options["device"] = log.device
    block = _label_int(labels, "block_size")
    if block and "block_size" not in options:
        options["block_size"] = block
    return options


def _labels_max_model_len(labels: dict[str, str] | None) -> int | None:
    """max_model_len from the cache config: `kv_cache_size_tokens = int(max concurrency x max_model_len)`, so the
    quotient is max_model_len to within 1 / concurrency (exact once rounded, for concurrency >= 1)."""
    tokens, concurrency = _label_int(labels, "kv_cache_size_tokens"), _label_float(labels, "kv_cache_max_concurrency")
    if not tokens or not concurrency or concurrency < 1:
        return None
    return round(tokens / concurrency)


def calibrate_vllm(log: VllmLog | None, labels: dict[str, str] | None, plan: Plan | None, source: str) -> Calibration:
    predicted = _predicted(plan)
    facts = log.facts if log else {}
    lines = log.lines if log else {}
    metric = "vllm:cache_config_info"
    rows: list[Comparison] = []
    notes: list[str] = []

    def add(term: str, unit: str, actual: Any, where: str) -> None:
        if actual is not None:
            rows.append(Comparison(term, unit, predicted.get(term), actual, where))

    pinned = plan.inputs.kv_cache_memory_bytes if plan else _label_int(labels, "kv_cache_memory_bytes")
    kv_actual = facts.get("kv_cache_bytes")
    kv_where = lines.get("kv_cache_bytes", "")
    if pinned and (kv_actual is None or abs(kv_actual - pinned) < 0.01 * (1 << 30)):
        kv_actual, kv_where = pinned, "--kv-cache-memory-bytes (vLLM allocates exactly this)"
    total = facts.get("total_memory_bytes") if log and log.device != "cpu" else None
    plan_total = total or (plan.inputs.gpu.memory_bytes if plan and plan.inputs.gpu else None)
    util = (
        facts.get("gpu_memory_utilization")
        or (plan.inputs.memory_fraction if plan else None)
        or _label_float(labels, "gpu_memory_utilization")
        or 0.92
    )
    cudagraph = log.cudagraph_bytes(plan_total) if log else None

    add("weights", "bytes", facts.get("weights_bytes"), lines.get("weights_bytes", ""))
    add(
        "activation",
        "bytes",
        log.activation_bytes if log else None,
        lines.get("activation_bytes") or lines.get("peak_torch_bytes", ""),
    )
    add("non_torch", "bytes", facts.get("non_torch_bytes"), lines.get("non_torch_bytes", ""))
    add("cuda_graphs", "bytes", cudagraph, lines.get("cudagraph_bytes") or lines.get("cudagraph_utilization", ""))
    overhead = None
    if not pinned and plan_total and facts.get("weights_bytes") is not None and kv_actual is not None:
        overhead = ceil(plan_total * util) - facts["weights_bytes"] - kv_actual
        source_total = "the log's total_gpu_memory" if total else f"{plan.inputs.gpu.id}'s catalog total"
        add("overhead", "bytes", overhead, f"ceil({source_total} x {util:g}) - weights - available KV cache")
    add("kv_cache", "bytes", kv_actual, kv_where)
    blocks = _label_int(labels, "num_gpu_blocks") or facts.get("num_gpu_blocks")
    add(
        "num_gpu_blocks",
        "blocks",
        blocks,
        f"{metric} num_gpu_blocks" if _label_int(labels, "num_gpu_blocks") else lines.get("num_gpu_blocks", ""),
    )
    tokens = _label_int(labels, "kv_cache_size_tokens") or (log.kv_cache_size_tokens if log else None)
    add(
        "kv_cache_size_tokens",
        "tokens",
        tokens,
        f"{metric} kv_cache_size_tokens"
        if _label_int(labels, "kv_cache_size_tokens")
        else lines.get("kv_cache_size_tokens", ""),
    )
    concurrency = (log.max_concurrency if log else None) or _label_float(labels, "kv_cache_max_concurrency")
    add("max_concurrency", "x", concurrency, lines.get("max_concurrency", f"{metric} kv_cache_max_concurrency"))
    if log and "kv_cache_bytes" in facts:
        notes.append("memory figures in vLLM logs have two decimals of GiB: exact to +-5 MiB")
    if plan is None:
        notes.append("no prediction: give --model (and --gpu) for the run to compare against the planner")

    profile = Profile(
        engine="vllm",
        source=source,
        model=(log.args.get("model") if log else None) or (plan.inputs.spec.name if plan else None),
        gpu=plan.inputs.gpu.id if plan and plan.inputs.gpu else None,
        tp=(log.args.get("tensor_parallel_size") if log else None) or (plan.inputs.tp if plan else None),
        max_num_batched_tokens=(log.args.get("max_num_batched_tokens") if log else None)
        or (plan.capacity.get("max_num_batched_tokens") if plan else None),
        total_memory_bytes=total,
        gpu_memory_utilization=util if not pinned else None,
        weights_bytes=facts.get("weights_bytes"),
        activation_bytes=log.activation_bytes if log else None,
        non_torch_bytes=facts.get("non_torch_bytes"),
        cudagraph_bytes=cudagraph,
        overhead_bytes=overhead if overhead is not None and overhead >= 0 else None,
        kv_cache_bytes=kv_actual,
        num_gpu_blocks=blocks,
        block_size=_label_int(labels, "block_size") or (log.args.get("block_size") if log else None),
    )
    return Calibration("vllm", source, rows, profile, notes)


# --- TGI ------------------------------------------------------------------------------------------------


def tgi_plan_options(log: TgiLog) -> dict[str, Any]:
    args = log.args
    options: dict[str, Any] = {"engine": "tgi"}
    if args.get("model_id"):
        options["model"] = args["model_id"]
    shards = args.get("num_shard") or log.get("num_shard")
    if shards:
        options["tp"] = shards
    if args.get("cuda_memory_fraction"):
        options["memory_fraction"] = args["cuda_memory_fraction"]
    prefill = args.get("max_batch_prefill_tokens") or log.get("max_batch_prefill_tokens")
    if prefill:
        options["batched_tokens"] = prefill
    total = args.get("max_total_tokens") or log.get("max_total_tokens")
    if total:
        options["max_model_len"] = total
    if args.get("kv_cache_dtype") in _TGI_KV_DTYPES:
        options["kv_dtype"] = _TGI_KV_DTYPES[args["kv_cache_dtype"]]
    return options


def calibrate_tgi(log: TgiLog, plan: Plan | None, source: str) -> Calibration:
    predicted = _predicted(plan)
    rows: list[Comparison] = []
    notes: list[str] = []
    total_tokens = log.get("max_batch_total_tokens")
    rows.append(
        Comparison(
            "max_batch_total_tokens",
            "tokens",
            predicted.get("max_batch_total_tokens"),
            total_tokens,
            log.lines.get("max_batch_total_tokens", ""),
        )
    )
    blocks = log.get("kv_blocks")
    if blocks:
        rows.append(
            Comparison("num_blocks", "blocks", predicted.get("num_gpu_blocks"), blocks[0], log.lines["kv_blocks"])
        )
    if log.get("no_automatic_total"):
        notes.append(
            "TGI could not size this model's KV pool (not a flash model): the total is its 16000-token default"
        )
    overhead = kv_actual = None
    if plan is not None and total_tokens and not log.get("no_automatic_total"):
        per_token = plan.capacity["kv_bytes_per_token"]
        kv_actual = total_tokens * per_token
        budget = next(term.bytes for term in plan.memory if term.name == "budget")
        weights = next(term.bytes for term in plan.memory if term.name == "weights")
        overhead = budget - weights - kv_actual
        rows.append(
            Comparison(
                "kv_cache",
                "bytes",
                predicted.get("kv_cache"),
                kv_actual,
                f"{total_tokens} tokens x {per_token} B per token per shard",
            )
        )
        rows.append(
            Comparison(
                "overhead",
                "bytes",
                predicted.get("overhead"),
                overhead,
                "budget - weights - KV pool (warmup activation, CUDA context, non-torch)",
            )
        )
    if plan is None:
        notes.append("no prediction: give --model and --gpu for the run to compare against the planner")
    profile = Profile(
        engine="tgi",
        source=source,
        model=log.args.get("model_id") or (plan.inputs.spec.name if plan else None),
        gpu=plan.inputs.gpu.id if plan and plan.inputs.gpu else None,
        tp=log.args.get("num_shard") or (plan.inputs.tp if plan else None),
        max_num_batched_tokens=log.args.get("max_batch_prefill_tokens") or log.get("max_batch_prefill_tokens"),
        overhead_bytes=overhead if overhead is not None and overhead >= 0 else None,
        kv_cache_bytes=kv_actual,
        num_gpu_blocks=blocks[0] if blocks else None,
        block_size=blocks[1] if blocks else None,
    )
    return Calibration("tgi", source, rows, profile, notes)


def _predicted(plan: Plan | None) -> dict[str, Any]:
    if plan is None:
        return {}
    terms = {term.name: term.bytes for term in plan.memory}
    cap = plan.capacity
    predicted: dict[str, Any] = {
        "weights": terms.get("weights"),
        "activation": terms.get("activation"),
        "non_torch": terms.get("non_torch"),
        "cuda_graphs": terms.get("cuda_graphs"),
        "kv_cache": plan.kv_cache_bytes,
        "num_gpu_blocks": cap.get("num_blocks"),
        "kv_cache_size_tokens": cap.get("kv_cache_size_tokens"),
        "max_concurrency": cap.get("max_concurrency"),
        "max_batch_total_tokens": cap.get("max_batch_total_tokens"),
    }
    if plan.engine == "vllm" and plan.inputs.kv_cache_memory_bytes is None:
        predicted["overhead"] = sum(terms.get(name, 0) for name in ("activation", "non_torch", "cuda_graphs"))
    if plan.engine == "tgi":
        predicted["overhead"] = sum(terms.get(name, 0) for name in ("activation", "non_torch"))
    return predicted
