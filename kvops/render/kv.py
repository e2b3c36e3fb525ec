"""`kvops kv` output: the JSON document and the human text, both traceable to the formula."""

from __future__ import annotations

from typing import Any

from kvops.formula import KVCost, MemoryFit, beam_search_estimate
from kvops.model.spec import ModelSpec
from kvops.units import format_bytes


def kv_document(spec: ModelSpec, cost: KVCost, warnings: list[str], fit: MemoryFit | None = None) -> dict[str, Any]:
    estimate = beam_search_estimate(cost.total_bytes, cost.beams)
    document = {
        "model": spec.name,
        "model_source": spec.source,
        "kv_dtype": cost.dtype.name,
        "dtype_bytes": cost.dtype.bytes,
        "scales": cost.dtype.scale_note() or None,
        "tp": cost.tp,
        "batch": cost.batch,
        "beams": cost.beams,
        "effective_batch": cost.effective_batch,
        "tokens": cost.tokens,
        "block_size": cost.block_size,
        "bytes_per_token": cost.bytes_per_token,
        "scale_bytes_per_token": cost.scale_bytes_per_token,
        "token_tax_bytes": cost.token_tax_bytes,
        "bytes_per_sequence": cost.sequence_bytes,
        "total_bytes": cost.total_bytes,
        "total_bytes_all_gpus": cost.total_bytes_all_gpus,
        "layer_groups": [
            {
                "kind": group.kind,
                "layers": group.layers,
                "kv_heads": group.kv_heads,
                "head_dim": group.head_dim,
                "window": group.window,
                "bytes_per_token": group.bytes_per_token,
                "scale_bytes_per_token": group.scale_bytes_per_token,
                "cached_tokens": group.cached_tokens,
                "token_slots": group.token_slots,
                "bytes_per_sequence": group.bytes,
                "formula": group.formula,
            }
            for group in cost.groups
        ],
        "beam_search_estimate": None
        if estimate is None
        else {
            "low_bytes": estimate[0],
            "high_bytes": estimate[1],
            "note": "an observation from practice (+20-30% over batch x beams), not part of total_bytes; "
            "HF transformers on an H200 measured beam search at exactly the greedy batch x beams figure",
        },
        "warnings": warnings,
    }
    if fit is not None:
        document["memory_bytes"] = fit.memory_bytes
        document["tokens_fit"] = fit.tokens
        document["tokens_per_sequence_fit"] = fit.tokens_per_sequence
    return document


def kv_text(spec: ModelSpec, cost: KVCost, fit: MemoryFit | None = None) -> str:
    lines = [
        f"{spec.name} ({spec.source})   kv dtype {cost.dtype.name}, {cost.dtype.bytes:g} B per value   tp {cost.tp}"
        + (f"   block size {cost.block_size}" if cost.block_size else ""),
        "",
        f"  {'group':<8} {'layers':>6} {'kv heads':>8} {'head dim':>8} {'window':>7} {'per token':>12} {'cached':>8} {'per sequence':>14}",
    ]
    for group in cost.groups:
        window = f"{group.window:,}" if group.window else "-"
        cached = group.token_slots
        lines.append(
            f"  {group.kind:<8} {group.layers:>6} {group.kv_heads:>8} {group.head_dim:>8} {window:>7} "
            f"{format_bytes(group.bytes_per_token):>12} {cached:>8,} {format_bytes(group.bytes):>14}"
        )
    lines.append("")
    formulas = " + ".join(f"({group.formula})" for group in cost.groups)
    rows = [
        ("bytes per token", format_bytes(cost.bytes_per_token), formulas),
        ("effective batch", f"{cost.effective_batch:,}", f"batch {cost.batch:,} x beams {cost.beams:,}"),
        ("token tax", format_bytes(cost.token_tax_bytes), "added per generated token, whole batch"),
        (
            "total",
            format_bytes(cost.total_bytes),
            f"{cost.effective_batch:,} x {format_bytes(cost.sequence_bytes)} per sequence of {cost.tokens:,} tokens, per GPU ({cost.total_bytes} B)",
        ),
    ]
    if cost.tp > 1:
        rows.append(("all GPUs", format_bytes(cost.total_bytes_all_gpus), f"x tp {cost.tp}"))
    if cost.scale_bytes_per_token:
        rows.append(
            ("of which scales", format_bytes(cost.scale_bytes_per_token), "per token: " + cost.dtype.scale_note())
        )
    elif cost.dtype.is_quantized:
        rows.append(("scales", "-", cost.dtype.scale_note()))
    estimate = beam_search_estimate(cost.total_bytes, cost.beams)
    if estimate:
        rows.append(
            (
                "beam estimate",
                f"{format_bytes(estimate[0])} - {format_bytes(estimate[1])}",
                "+20-30% seen in practice, not in total",
            )
        )
    if fit is not None:
        rows += _fit_rows(spec, cost, fit)
    width = max(len(label) for label, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines += [f"{label:<{width}}  {value:>{value_width}}   {why}" for label, value, why in rows]
    return "\n".join(lines)


def _fit_rows(spec: ModelSpec, cost: KVCost, fit: MemoryFit) -> list[tuple[str, str, str]]:
    """What --memory holds: every token on every layer (plain arithmetic), and the longest sequence with windows
    and blocks applied, which holds more where windows cap some layers."""
    per_sequence = fit.tokens_per_sequence
    arithmetic = f"{format_bytes(fit.memory_bytes)} / {format_bytes(cost.bytes_per_token)} per token ({fit.memory_bytes} B / {cost.bytes_per_token} B)"
    if per_sequence is None or per_sequence * cost.effective_batch > fit.tokens:
        arithmetic += "; every token on every layer, windows not applied (longest sequence: applied)"
    longest = f"tokens per sequence for {cost.effective_batch:,} sequences in {format_bytes(fit.memory_bytes)}, windows{' and blocks' if cost.block_size else ''} applied"
    if per_sequence is None:
        longest += ": every layer's window fits"
    limit = spec.max_position_embeddings
    if limit and (per_sequence is None or per_sequence > limit):
        longest += f"; the model takes at most {limit:,} positions"
    return [
        ("tokens that fit", f"{fit.tokens:,}", arithmetic),
        ("longest sequence", "any" if per_sequence is None else f"{per_sequence:,}", longest),
    ]
