"""Calibrating a vLLM run: what its startup log and its live cache config measured, against the plan, term by
term, and the profile that replaces the planner's estimates."""

from __future__ import annotations

from math import ceil
from typing import Any

from kvops.calibrate import Calibration, Comparison, predicted_figures
from kvops.engines.vllm.logs import VllmLog
from kvops.engines.vllm.metrics import CacheConfig
from kvops.engines.vllm.plan import VllmCapacity
from kvops.plan import Plan
from kvops.profile import Profile


def calibrate(log: VllmLog | None, config: CacheConfig | None, plan: Plan | None, source: str) -> Calibration:
    predicted = predicted_figures(plan)
    facts = log.facts if log else {}
    lines = log.lines if log else {}
    metric = "vllm:cache_config_info"
    rows: list[Comparison] = []
    notes: list[str] = []

    def add(term: str, unit: str, actual: Any, where: str) -> None:
        if actual is not None:
            rows.append(Comparison(term, unit, predicted.get(term), actual, where))

    pinned = plan.inputs.kv_cache_memory_bytes if plan else _label(config, "kv_cache_memory_bytes")
    kv_actual = facts.get("kv_cache_bytes")
    kv_where = lines.get("kv_cache_bytes", "")
    if pinned and (kv_actual is None or abs(kv_actual - pinned) < 0.01 * (1 << 30)):
        kv_actual, kv_where = pinned, "--kv-cache-memory-bytes (vLLM allocates exactly this)"
    total = facts.get("total_memory_bytes") if log and log.device != "cpu" else None
    plan_total = total or (plan.inputs.gpu.memory_bytes if plan and plan.inputs.gpu else None)
    util = (
        facts.get("gpu_memory_utilization")
        or (plan.inputs.memory_fraction if plan else None)
        or _number(config, "gpu_memory_utilization")
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
    blocks = _label(config, "num_gpu_blocks") or facts.get("num_gpu_blocks")
    add(
        "num_gpu_blocks",
        "blocks",
        blocks,
        f"{metric} num_gpu_blocks" if _label(config, "num_gpu_blocks") else lines.get("num_gpu_blocks", ""),
    )
    tokens = _label(config, "kv_cache_size_tokens") or (log.kv_cache_size_tokens if log else None)
    add(
        "kv_cache_size_tokens",
        "tokens",
        tokens,
        f"{metric} kv_cache_size_tokens"
        if _label(config, "kv_cache_size_tokens")
        else lines.get("kv_cache_size_tokens", ""),
    )
    concurrency = (log.max_concurrency if log else None) or _number(config, "kv_cache_max_concurrency")
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
        or (plan.capacity.max_num_batched_tokens if plan and isinstance(plan.capacity, VllmCapacity) else None),
        total_memory_bytes=total,
        gpu_memory_utilization=util if not pinned else None,
        weights_bytes=facts.get("weights_bytes"),
        activation_bytes=log.activation_bytes if log else None,
        non_torch_bytes=facts.get("non_torch_bytes"),
        cudagraph_bytes=cudagraph,
        overhead_bytes=overhead if overhead is not None and overhead >= 0 else None,
        kv_cache_bytes=kv_actual,
        num_gpu_blocks=blocks,
        block_size=_label(config, "block_size") or (log.args.get("block_size") if log else None),
    )
    return Calibration("vllm", source, rows, profile, notes)


def _label(config: CacheConfig | None, name: str) -> int | None:
    return config.integer(name) if config else None


def _number(config: CacheConfig | None, name: str) -> float | None:
    return config.number(name) if config else None
