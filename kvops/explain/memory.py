"""The memory split per GPU: every term from the best source that has it (the engine, nvidia-smi, the plan),
each marked with where it came from, and the totals they add up to."""

from __future__ import annotations

from dataclasses import asdict
from math import ceil
from typing import Any

from kvops.engines.vllm.logs import EngineOutOfMemory, KvTooSmall, StartupFreeMemory
from kvops.explain.run import TERMS, Run, planned_capacity
from kvops.frozen import frozen
from kvops.plan import Plan, PlanInputs
from kvops.units import format_bytes

LOG_ROUNDING = "vLLM logs GiB with two decimals: +-5 MiB"


@frozen
class Figure:
    """One memory figure per GPU and where it came from."""

    name: str
    bytes: int | None
    basis: str  # reported | derived | nvidia-smi | input | computed | estimate | exact | missing | n/a
    source: str
    line: str | None = None  # the whole log line it was read from

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory_figures(run: Run, predicted: Plan | None, inputs: PlanInputs | None) -> list[Figure]:
    """Every term per GPU, each from the best source that has it: the engine, nvidia-smi, then the plan."""
    facts, log = run.facts, run.log
    planned = {term.name: term for term in predicted.memory} if predicted else {}
    figures: list[Figure] = [_total(run, planned)]
    failure = run.failure
    failed_allocation = failure if isinstance(failure, EngineOutOfMemory) else None
    oom = failed_allocation.oom if failed_allocation else None
    if run.smi:
        figures.append(Figure("used", run.smi.used_bytes, "nvidia-smi", f"{run.smi_source}: {run.smi.describe()}"))
    elif failed_allocation and oom and oom.total_bytes is not None and oom.free_bytes is not None:
        figures.append(
            Figure(
                "used",
                oom.total_bytes - oom.free_bytes,
                "reported",
                "total - free in torch's out-of-memory message, at the failed allocation",
                failed_allocation.line,
            )
        )
    # free at startup is torch's: less torch's own total where the log has it (nvidia-smi's total is another figure)
    torch_total = facts.get("total_memory_bytes") or figures[0].bytes
    if facts.get("startup_free_bytes") is not None and torch_total:
        figures.append(
            Figure(
                "before_engine",
                torch_total - facts["startup_free_bytes"],
                "derived",
                f"total - free at startup (other processes, CUDA contexts): log {run.quote('startup_free_bytes')}",
                run.line("startup_free_bytes"),
            )
        )
    figures.append(_requested(run, figures[0], inputs))

    def reported(name: str, value: int | None, fact: str) -> Figure | None:
        return Figure(name, value, "reported", f"log: {run.quote(fact)}", run.line(fact)) if value is not None else None

    def from_plan(name: str) -> Figure:
        term = planned.get(name)
        if term is not None:
            return Figure(name, term.bytes, term.basis, f"plan: {term.formula}")
        if run.device == "cpu":
            return Figure(
                name, None, "missing", "the CPU build logs no such figure (host memory, not measured per term)"
            )
        return Figure(
            name,
            None,
            "missing",
            "not reported by the engine" + ("" if predicted else "; give --model for the planner's figure"),
        )

    weights = reported("weights", facts.get("weights_bytes"), "weights_bytes")
    if (
        weights is None
        and failed_allocation
        and failed_allocation.phase == "weights"
        and oom
        and oom.allocated_bytes is not None
    ):
        whole = f"; the plan's full weights: {format_bytes(planned['weights'].bytes)}" if "weights" in planned else ""
        weights = Figure(
            "weights",
            oom.allocated_bytes,
            "reported",
            f"at least: PyTorch's allocation when loading failed, {format_bytes(oom.tried_bytes)} more asked{whole}",
            failed_allocation.line,
        )
    non_torch = reported("non_torch", facts.get("non_torch_bytes"), "non_torch_bytes")
    if non_torch is None and log and log.non_torch_bytes is not None:
        non_torch = Figure(
            "non_torch",
            log.non_torch_bytes,
            "derived",
            f"log {run.quote('consumed_bytes')} less the weights",
            run.line("consumed_bytes"),
        )
    if weights is None and non_torch is None and "consumed_bytes" in facts:
        figures.append(
            Figure(
                "weights+non_torch",
                facts["consumed_bytes"],
                "reported",
                f"log: {run.quote('consumed_bytes')}",
                run.line("consumed_bytes"),
            )
        )
    else:
        figures.append(weights or from_plan("weights"))
        figures.append(non_torch or from_plan("non_torch"))
    figures.append(_activation(run, from_plan))
    figures.append(_cuda_graphs(run, figures[0].bytes, from_plan))
    figures.append(_kv_cache(run, predicted, from_plan))
    figures = [_not_reached(run, item) for item in figures]
    overhead = _overhead(figures)
    if overhead:
        figures.append(overhead)
    return figures + _totals(figures)


# The terms a failure came before: the engine never measured or allocated them.
_NOT_REACHED = {
    "weights": ("activation", "cuda_graphs", "kv_cache"),
    "startup_free_memory": ("weights", "non_torch", "activation", "cuda_graphs", "kv_cache"),
}


def _not_reached(run: Run, item: Figure) -> Figure:
    failure = run.failure
    key = (
        "startup_free_memory"
        if isinstance(failure, StartupFreeMemory)
        else failure.phase
        if isinstance(failure, EngineOutOfMemory) and failure.phase
        else ""
    )
    if item.name not in _NOT_REACHED.get(key, ()) or item.basis in ("reported", "derived"):
        return item
    planned = (
        f" (the plan's figure: {format_bytes(item.bytes)})"
        if item.bytes is not None and item.basis in ("computed", "estimate")
        else ""
    )
    where = "at its startup check" if key == "startup_free_memory" else "while loading the weights"
    return Figure(item.name, None, "n/a", f"not reached: the engine failed {where}{planned}")


def _implied_kv(run: Run) -> Figure | None:
    """KV the budget left when the log itemises every other term: budget - weights - activation - non-torch
    (- the CUDA-graph estimate, when vLLM applied one), as `determine_available_memory` computes it."""
    log, facts = run.log, run.facts
    if (
        not log
        or "requested_bytes" not in facts
        or "weights_bytes" not in facts
        or log.activation_bytes is None
        or log.non_torch_bytes is None
    ):
        return None
    reserve = log.cudagraph_estimate_applied or 0
    kv = facts["requested_bytes"] - facts["weights_bytes"] - log.activation_bytes - log.non_torch_bytes - reserve
    graphs = " - the CUDA-graph estimate" if reserve else ""
    return Figure(
        "kv_cache",
        kv,
        "derived",
        f"budget - weights - activation peak - non-torch{graphs}: what the log's figures leave (vLLM's sizing)",
    )


def _overhead(figures: list[Figure]) -> Figure | None:
    """When the engine reported its budget, weights and KV but not every other term: their sum, as its numbers
    imply it (vLLM sizes KV = budget - weights - non-torch - activation peak [- CUDA-graph estimate, 0.21+])."""
    by_name = {item.name: item for item in figures}
    requested, weights, kv = by_name["requested"], by_name.get("weights"), by_name["kv_cache"]
    others = [by_name[name] for name in ("non_torch", "activation") if name in by_name]
    if requested.bytes is None or kv.basis != "reported" or kv.bytes is None or weights is None:
        return None
    if weights.basis != "reported" or weights.bytes is None:
        return Figure(
            "weights+overhead",
            requested.bytes - kv.bytes,
            "derived",
            "budget - KV cache: weights + non-torch + activation peak (+ the CUDA-graph estimate vLLM >= 0.21 reserves), as the engine sized them",
        )
    if all(item.basis in ("reported", "derived") for item in others):
        return None
    return Figure(
        "overhead",
        requested.bytes - weights.bytes - kv.bytes,
        "derived",
        "budget - weights - KV cache: non-torch + activation peak (+ the CUDA-graph estimate vLLM >= 0.21 reserves), as the engine sized them",
    )


def device_total(run: Run) -> int | None:
    """The device total the run's own outputs state (nvidia-smi, the log, an error message), for the planner."""
    return _total(run, {}).bytes


def _total(run: Run, planned: dict) -> Figure:
    if run.smi:
        return Figure("total", run.smi.total_bytes, "nvidia-smi", f"{run.smi_source}: {run.smi.describe()}")
    if run.facts.get("total_memory_bytes"):
        what = "host memory of the NUMA node (CPU build)" if run.device == "cpu" else "the device total torch saw"
        return Figure(
            "total",
            run.facts["total_memory_bytes"],
            "reported",
            f"{what}: log {run.quote('total_memory_bytes')}",
            run.line("total_memory_bytes"),
        )
    failure = run.failure
    if isinstance(failure, EngineOutOfMemory) and failure.oom and failure.oom.total_bytes:
        return Figure(
            "total",
            failure.oom.total_bytes,
            "reported",
            "torch's out-of-memory message: 'GPU N has a total capacity of ...'",
            failure.line,
        )
    if isinstance(failure, StartupFreeMemory):
        return Figure(
            "total",
            failure.total_bytes,
            "reported",
            "the startup check: 'Free memory on device (free/total GiB)'",
            failure.line,
        )
    if "total" in planned:
        return Figure("total", planned["total"].bytes, planned["total"].basis, planned["total"].formula)
    return Figure("total", None, "missing", "no device total: give --nvidia-smi FILE, --gpu NAME or --gpu-memory SIZE")


def _requested(run: Run, total: Figure, inputs: PlanInputs | None) -> Figure:
    facts = run.facts
    if facts.get("requested_bytes"):
        return Figure(
            "requested",
            facts["requested_bytes"],
            "reported",
            f"log: {run.quote('requested_bytes')}",
            run.line("requested_bytes"),
        )
    pinned = run.pinned_kv_bytes
    if pinned:
        return Figure(
            "requested",
            None,
            "n/a",
            f"--kv-cache-memory-bytes {pinned}: vLLM sizes nothing from gpu_memory_utilization",
        )
    stated = (
        facts.get("gpu_memory_utilization")
        or (facts["cudagraph_utilization"][0] if "cudagraph_utilization" in facts else None)
        or run.label_float("gpu_memory_utilization")
    )
    utilization = stated or (inputs.memory_fraction if inputs else None)
    if utilization and total.bytes and run.device == "gpu":
        where = "the run's" if stated else "the given"
        return Figure(
            "requested",
            ceil(total.bytes * utilization),
            "derived",
            f"ceil(total x {where} gpu_memory_utilization {utilization:g}) (vLLM's budget)",
        )
    return Figure("requested", None, "missing", "gpu_memory_utilization not known")


def _activation(run: Run, from_plan) -> Figure:
    log, facts = run.log, run.facts
    value = log.activation_bytes if log else None
    if value is None:
        return from_plan("activation")
    if "activation_bytes" in facts:
        return Figure(
            "activation", value, "reported", f"log: {run.quote('activation_bytes')}", run.line("activation_bytes")
        )
    if "peak_torch_bytes" in facts:
        return Figure(
            "activation",
            value,
            "derived",
            f"log {run.quote('peak_torch_bytes')} less the weights",
            run.line("peak_torch_bytes"),
        )
    applied = log.cudagraph_estimate_applied if log else None
    if applied:
        return Figure(
            "activation",
            value,
            "derived",
            f"log {run.quote('peak_activation_bytes')} less the CUDA-graph estimate ({format_bytes(applied)}) vLLM counts in it",
            run.line("peak_activation_bytes"),
        )
    return Figure(
        "activation", value, "reported", f"log: {run.quote('peak_activation_bytes')}", run.line("peak_activation_bytes")
    )


def _cuda_graphs(run: Run, total: int | None, from_plan) -> Figure:
    facts, log = run.facts, run.log
    if run.device == "cpu":
        return Figure("cuda_graphs", 0, "exact", "the CPU build captures no CUDA graphs")
    if log and log.args.get("enforce_eager"):
        return Figure("cuda_graphs", 0, "exact", "--enforce-eager: no CUDA graphs")
    if "cudagraph_captured_bytes" in facts:
        reserve = log.cudagraph_estimate_applied if log else None
        extra = f" (vLLM reserved its estimate, {format_bytes(reserve)}, for them in the budget)" if reserve else ""
        return Figure(
            "cuda_graphs",
            facts["cudagraph_captured_bytes"],
            "reported",
            f"log: {run.quote('cudagraph_captured_bytes')}{extra}",
            run.line("cudagraph_captured_bytes"),
        )
    estimate = log.cudagraph_bytes(facts.get("total_memory_bytes") or total) if log else None
    if estimate is not None:
        if "cudagraph_bytes" in facts:
            return Figure(
                "cuda_graphs",
                estimate,
                "reported",
                f"vLLM's estimate, reserved before sizing KV: log {run.quote('cudagraph_bytes')}",
                run.line("cudagraph_bytes"),
            )
        return Figure(
            "cuda_graphs",
            estimate,
            "derived",
            f"vLLM's estimate, reserved before sizing KV: the utilization it is worth x total, log {run.quote('cudagraph_utilization')}",
            run.line("cudagraph_utilization"),
        )
    return from_plan("cuda_graphs")


def _kv_cache(run: Run, predicted: Plan | None, from_plan) -> Figure:
    pinned = run.pinned_kv_bytes
    if pinned:
        where = (
            "the run's --kv-cache-memory-bytes"
            if run.log and run.log.args.get("kv_cache_memory_bytes")
            else "vllm:cache_config_info kv_cache_memory_bytes"
        )
        return Figure("kv_cache", pinned, "reported", f"{where} (vLLM allocates exactly this)")
    if "kv_cache_bytes" in run.facts:
        return Figure(
            "kv_cache",
            run.facts["kv_cache_bytes"],
            "reported",
            f"log: {run.quote('kv_cache_bytes')}",
            run.line("kv_cache_bytes"),
        )
    failure = run.failure
    if isinstance(failure, KvTooSmall):
        return Figure(
            "kv_cache",
            failure.available_bytes,
            "reported",
            "the KV error: 'larger than the available KV cache memory (...)'",
            failure.line,
        )
    implied = _implied_kv(run)
    if implied is not None:
        return implied
    blocks = run.label_int("num_gpu_blocks")
    cap = planned_capacity(predicted)
    if blocks and cap:
        per_block = cap.bytes_per_block
        return Figure(
            "kv_cache",
            blocks * per_block,
            "derived",
            f"vllm:cache_config_info num_gpu_blocks {blocks} x {per_block} B per block (plan's layout)",
        )
    return from_plan("kv_cache")


def _totals(figures: list[Figure]) -> list[Figure]:
    """The engine's memory in all (the derived overhead standing for the terms it covers) and what is left."""
    by_name = {item.name: item for item in figures}
    derived = next((name for name in ("overhead", "weights+overhead") if name in by_name), "")
    names = {"overhead": ("weights", "overhead", "kv_cache"), "weights+overhead": ("weights+overhead", "kv_cache")}.get(
        derived, (*TERMS, "weights+non_torch")
    )
    parts = [item for item in figures if item.name in names]
    known = [item for item in parts if item.bytes is not None]
    if not known:
        return []
    engine = sum(max(0, item.bytes) for item in known if item.bytes is not None)
    missing = [item.name for item in parts if item.bytes is None]
    bases = ", ".join(sorted({item.basis for item in known}))
    what = {
        "overhead": "weights + overhead + KV cache",
        "weights+overhead": "weights + overhead + KV cache (the budget)",
    }.get(derived, "sum of the terms above")
    out = [
        Figure(
            "engine", engine, "derived", f"{what} ({bases})" + (f"; without {', '.join(missing)}" if missing else "")
        )
    ]
    total, used, before = by_name["total"], by_name.get("used"), by_name.get("before_engine")
    if used is not None and used.bytes is not None and used.basis == "nvidia-smi":
        unreported = f", and the unreported {', '.join(missing)}" if missing else ""
        out.append(
            Figure(
                "outside_engine",
                used.bytes - engine,
                "derived",
                f"nvidia-smi used - the engine's terms: CUDA context, other processes, allocator cache{unreported}",
            )
        )
    if total.bytes is not None and used is not None and used.bytes is not None:
        out.append(Figure("free", total.bytes - used.bytes, "derived", "total - used"))
    elif total.bytes is not None and not missing and before is not None and before.bytes is not None:
        out.append(
            Figure(
                "free",
                total.bytes - before.bytes - engine,
                "derived",
                "total - held before startup - the engine's terms",
            )
        )
    elif total.bytes is not None and not missing:
        out.append(
            Figure(
                "free",
                total.bytes - engine,
                "derived",
                "total - the engine's terms (free, CUDA context, other processes)",
            )
        )
    return out


def inconsistent(figures: list[Figure]) -> list[str]:
    """Figures that cannot all be true of one device: more held than it has (an edited log, or lines of two runs)."""
    by_name = {item.name: item.bytes for item in figures if item.bytes is not None}
    total = by_name.get("total")
    notes: list[str] = []
    if total is None:
        return notes
    for name in ("engine", "weights", "used"):
        if by_name.get(name, 0) > total:
            notes.append(
                f"the figures do not add up: {name} {format_bytes(by_name[name])} is more than the device total "
                f"{format_bytes(total)} (an edited log, or lines of two runs?)"
            )
    if by_name.get("before_engine", 0) < 0:
        notes.append("the figures do not add up: the log's free memory at startup is more than its total")
    return notes
