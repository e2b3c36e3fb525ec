"""A failed run read from its own error: which term ran out, in the figures the message states."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvops.engines.oom import OutOfMemory
from kvops.engines.vllm.logs import (
    EngineOutOfMemory,
    Failure,
    KvTokensTooFew,
    KvTooSmall,
    NoKvMemory,
    StartupFreeMemory,
)
from kvops.explain.memory import Figure
from kvops.explain.run import TERM_LABELS, Run, planned_capacity
from kvops.plan import Plan
from kvops.units import format_bytes


@dataclass
class Diagnosis:
    """Which term ran out, in the failure's own numbers."""

    term: str  # weights | activation | cuda_graphs | kv_cache | other_processes | unknown
    phase: str | None
    summary: str
    figures: dict[str, Any]
    line: str
    basis: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def diagnose(failure: Failure | None, run: Run, figures: list[Figure], predicted: Plan | None) -> Diagnosis | None:
    if failure is None:
        return None
    if isinstance(failure, KvTooSmall):
        return _kv_too_small(failure, run, predicted)
    if isinstance(failure, KvTokensTooFew):
        return _kv_tokens_too_few(failure, run)
    if isinstance(failure, NoKvMemory):
        return _no_kv_memory(failure, run, figures)
    if isinstance(failure, StartupFreeMemory):
        others = failure.total_bytes - failure.startup_free_bytes
        return Diagnosis(
            "other_processes",
            None,
            f"vLLM needs {format_bytes(failure.requested_bytes)} ({failure.utilization:g} x {format_bytes(failure.total_bytes)}) but only "
            f"{format_bytes(failure.startup_free_bytes)} was free at startup: something else holds {format_bytes(others)} of the device",
            {
                "free_bytes": failure.startup_free_bytes,
                "total_bytes": failure.total_bytes,
                "requested_bytes": failure.requested_bytes,
                "utilization": failure.utilization,
                "held_by_others_bytes": others,
            },
            failure.line,
            "why: vLLM's startup check wants gpu_memory_utilization x total free",
        )
    return _out_of_memory(failure, run)


def _kv_too_small(failure: KvTooSmall, run: Run, predicted: Plan | None) -> Diagnosis:
    pinned = run.pinned_kv_bytes
    available = pinned or failure.available_bytes
    needed = _needed_kv(failure, predicted)
    figures: dict[str, Any] = {
        "max_model_len": failure.max_model_len,
        "needed_bytes": needed,
        "available_bytes": available,
        "estimated_max_model_len": failure.estimated_max_model_len,
        "message_needed_bytes": failure.needed_bytes,
        "message_available_bytes": failure.available_bytes,
    }
    text = (
        f"one request at max_model_len {failure.max_model_len:,} needs {format_bytes(needed)} of KV cache, "
        f"the engine had {format_bytes(available)}"
    )
    if failure.estimated_max_model_len:
        text += f"; vLLM estimates {failure.estimated_max_model_len:,} tokens fit"
    return Diagnosis("kv_cache", None, text, figures, failure.line, _kv_basis(run))


def _kv_tokens_too_few(failure: KvTokensTooFew, run: Run) -> Diagnosis:
    figures: dict[str, Any] = {"max_model_len": failure.max_model_len, "kv_tokens": failure.kv_tokens}
    text = (
        f"one request at max_model_len {failure.max_model_len:,} does not fit the KV cache: "
        f"it holds {failure.kv_tokens:,} tokens"
    )
    if run.facts.get("kv_cache_bytes") is not None:
        figures["available_bytes"] = run.facts["kv_cache_bytes"]
        text += f" ({format_bytes(run.facts['kv_cache_bytes'])})"
    return Diagnosis("kv_cache", None, text, figures, failure.line, _kv_basis(run))


def _kv_basis(run: Run) -> str:
    if run.pinned_kv_bytes:
        return "why: --kv-cache-memory-bytes pins a pool too small for --max-model-len"
    if run.log is not None and "after_warmup" in run.facts:
        return (
            "why: the memory free after CUDA-graph capture and warmup (less what was in use before startup), less "
            "vLLM's margin and the transient it keeps free, holds less than one request at max_model_len (the "
            "extensible KV cache, sized after warmup)"
        )
    return (
        "why: the budget left after weights, activation peak and non-torch (and, from vLLM 0.21, the CUDA-graph "
        "estimate) holds less than one request at max_model_len"
    )


def _needed_kv(failure: KvTooSmall, predicted: Plan | None) -> int:
    """KV for one request at max_model_len (`max_memory_usage_bytes`): the plan's exact figure when it models
    this run (the message rounds to 0.01 GiB), else the message's."""
    cap = planned_capacity(predicted)
    if cap and cap.max_model_len == failure.max_model_len and cap.blocks_per_request_at_max_model_len:
        return cap.bytes_per_block * cap.blocks_per_request_at_max_model_len
    return failure.needed_bytes


def _no_kv_memory(failure: NoKvMemory, run: Run, figures: list[Figure]) -> Diagnosis:
    by_name = {item.name: item for item in figures}
    kv = failure.available_bytes if failure.available_bytes is not None else run.facts.get("kv_cache_bytes")
    parts = [
        by_name[name]
        for name in ("weights", "non_torch", "activation")
        if name in by_name and by_name[name].bytes is not None
    ]
    took = ", ".join(
        f"{TERM_LABELS[item.name]} {format_bytes(item.bytes)} ({item.basis})"
        for item in parts
        if item.bytes is not None
    )
    requested = by_name.get("requested")
    budget = f" of the {format_bytes(requested.bytes)} budget" if requested and requested.bytes else ""
    text = (
        f"nothing was left for the KV cache{budget} after the other terms"
        + (f" ({format_bytes(kv)} available)" if kv is not None else "")
        + (f": {took}" if took else "")
    )
    return Diagnosis(
        "kv_cache",
        None,
        text,
        {
            "available_bytes": kv,
            "requested_bytes": requested.bytes if requested else None,
            **{f"{item.name}_bytes": item.bytes for item in parts},
        },
        failure.line,
        "why: weights, activation peak and non-torch took the whole budget",
    )


PHASE_TEXT = {
    "weights": "while loading the weights",
    "activation": "in the profile run or sampler warm-up (the activation peak)",
    "cuda_graphs": "while capturing CUDA graphs",
    "kv_cache": "while allocating the KV cache",
    "serving": "while serving (a forward pass after startup)",
}


def _out_of_memory(failure: EngineOutOfMemory, run: Run) -> Diagnosis:
    oom = failure.oom
    phase = failure.phase
    term = "activation" if phase == "serving" else phase or "unknown"
    where = PHASE_TEXT.get(phase or "", "at a point the log does not show")
    if oom is None:
        return Diagnosis(
            term,
            failure.phase,
            f"out of memory {where}; the error carries no figures",
            {},
            failure.line,
            _phase_basis(failure),
        )
    figures = {key: value for key, value in asdict(oom).items() if key != "other_processes"}
    figures["other_processes"] = [{"pid": pid, "bytes": amount} for pid, amount in oom.other_processes]
    text = f"out of memory {where}: {oom.backend} could not allocate {format_bytes(oom.tried_bytes)}"
    if oom.free_bytes is not None and oom.total_bytes is not None:
        text += f" with {format_bytes(oom.free_bytes)} free of {format_bytes(oom.total_bytes)}"
        shortfall = oom.shortfall_bytes
        figures["shortfall_bytes"] = shortfall
        if shortfall is not None and shortfall <= 0:
            text += " (more was free than asked: fragmentation or a device limit, not the total)"
    if oom.process_bytes is not None:
        text += f"; the engine held {format_bytes(oom.process_bytes)}"
        if oom.allocated_bytes is not None:
            text += f" ({format_bytes(oom.allocated_bytes)} in PyTorch tensors"
            text += f", {format_bytes(oom.private_pool_bytes)} in CUDA-graph pools" if oom.private_pool_bytes else ""
            text += ")"
    others = _held_by_others(oom)
    if others is not None:
        figures["held_by_others_bytes"] = others
        if others >= 256 << 20:
            text += f"; other processes held {format_bytes(others)}"
            shortfall = oom.shortfall_bytes
            if shortfall is not None and 0 < shortfall <= others:
                text += " (without them the allocation would have fit)"
                term = "other_processes"
    elif oom.other_processes:
        listed = ", ".join(f"process {pid} {format_bytes(amount)}" for pid, amount in oom.other_processes)
        text += f"; on the device: {listed} (torch names the engine itself by PID inside a container)"
    return Diagnosis(term, failure.phase, text, figures, failure.line, _phase_basis(failure))


def _phase_basis(failure: EngineOutOfMemory) -> str:
    return (
        f"phase read from {failure.phase_basis}"
        if failure.phase_basis
        else "phase unknown: no traceback frame or startup line names it"
    )


def _held_by_others(oom: OutOfMemory) -> int | None:
    """Device memory neither free nor this process's: total - free - this process (torch rounds to 0.01 units)."""
    if oom.total_bytes is None or oom.free_bytes is None or oom.process_bytes is None:
        return None
    return max(0, oom.total_bytes - oom.free_bytes - oom.process_bytes)
