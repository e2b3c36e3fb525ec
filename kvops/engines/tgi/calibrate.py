"""Calibrating a TGI run: what its launcher log measured (the KV pool in tokens and blocks), against the plan,
and the profile that replaces the planner's estimates."""

from __future__ import annotations

from kvops.calibrate import Calibration, Comparison, predicted_figures
from kvops.engines.tgi.logs import TgiLog
from kvops.engines.tgi.plan import TgiCapacity
from kvops.plan import Plan
from kvops.profile import Profile


def calibrate(log: TgiLog, plan: Plan | None, source: str) -> Calibration:
    predicted = predicted_figures(plan)
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
    if (
        plan is not None
        and isinstance(plan.capacity, TgiCapacity)
        and total_tokens
        and not log.get("no_automatic_total")
    ):
        per_token = plan.capacity.kv_bytes_per_token
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
