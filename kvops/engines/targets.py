"""The GPU-memory target (the policy's `gpu_memory.below`) against a plan, engine-neutral and pure.

An engine reserves its share of the device at start (vLLM's --gpu-memory-utilization, 0.92 by default; TGI's
--cuda-memory-fraction, 1.0): weights, the profiled activation peak, CUDA graphs and the whole KV pool. A device
monitor then reads that share from the first second, whatever the load. What grows with load is the KV blocks in
use, so the target is held on memory in use:

    in use(u) = weights + overheads + u x KV pool        u: the KV usage, 0-1
    in use(u) <= below x device total  <=>  u <= (below x total - weights - overheads) / KV pool
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from kvops.engines.common import OVERHEAD_TERMS
from kvops.units import format_bytes

if TYPE_CHECKING:
    from kvops.plan import Plan

NON_KV_TERMS = ("weights", *OVERHEAD_TERMS)


def non_kv_bytes(terms: Iterable[tuple[str, int]]) -> int:
    """Weights and overheads: what the device holds whatever the KV usage."""
    return sum(size for name, size in terms if name in NON_KV_TERMS)


def kv_usage_at_target(non_kv: int, kv_bytes: int, total: int, below: float) -> float | None:
    """The KV usage at which memory in use reaches `below` of the device; None when the plan has no KV pool."""
    if kv_bytes <= 0 or total <= 0:
        return None
    return (below * total - non_kv) / kv_bytes


def note(
    fraction: float, flag: str, non_kv: int, kv_bytes: int, total: int, below: float, warn: float = 1.0
) -> str | None:
    """Why the plan reserves more of the device than the target, when it does: a plan note."""
    if fraction <= below:
        return None
    at = kv_usage_at_target(non_kv, kv_bytes, total, below)
    if at is None:
        return None
    head = (
        f"--{flag} {fraction:g} reserves more than the {below:.0%} GPU-memory target: the engine takes that share at "
        f"start (weights, overheads and the whole KV pool), so a device monitor reads {fraction:.0%} from the first "
        f"second; memory in use is weights and overheads {format_bytes(non_kv)} + the KV blocks in use"
    )
    if at <= 0:
        return f"{head}, and weights and overheads alone exceed {below:.0%} of {format_bytes(total)}"
    if at >= 1:
        return f"{head}, which stays under {below:.0%} of {format_bytes(total)} even with the KV cache full"
    if at < warn:
        share = (non_kv + warn * kv_bytes) / total
        return (
            f"{head}, which reaches {below:.0%} of {format_bytes(total)} at {at:.1%} KV usage, below the warn level: "
            f"the GPUMemoryHigh rule of kvops manifests alerts where KV usage reaches {warn:.0%} ({share:.1%} of "
            "the device)"
        )
    return f"{head}, which reaches {below:.0%} of {format_bytes(total)} at {at:.1%} KV usage (where the GPUMemoryHigh rule of kvops manifests alerts)"


def with_note(plan: Plan, flag: str) -> Plan:
    """The plan with the GPU-memory note when its share of the device is above the policy's target."""
    target, fraction = plan.inputs.gpu_memory_target, plan.flags.get(flag)
    total, requested = plan.term("total"), plan.term("requested")
    if fraction is None and total is not None and requested is not None and total.bytes:
        fraction = requested.bytes / total.bytes  # left unset (vLLM 0.34's default, 1.0): the share it requests
        flag = f"{flag} left unset, resolving to"
    if target is None or not isinstance(fraction, float) or total is None or plan.kv_cache_bytes <= 0:
        return plan
    non_kv = non_kv_bytes((t.name, t.bytes) for t in plan.memory)
    text = note(fraction, flag, non_kv, plan.kv_cache_bytes, total.bytes, target, plan.inputs.warn_level)
    return replace(plan, notes=(*plan.notes, text)) if text else plan
