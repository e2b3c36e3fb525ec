"""The one next action: the planner's first way out that fits, re-planned on the run's real KV pool; where the
planner cannot reproduce a failure, the engine's own advice, with its numbers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from math import ceil, floor
from typing import Any

from kvops.engines.vllm.capacity import VllmCapacity
from kvops.engines.vllm.logs import KvTokensTooFew, KvTooSmall, NoKvMemory, StartupFreeMemory
from kvops.errors import KvopsError
from kvops.explain.failures import Diagnosis
from kvops.explain.kv_now import KvNow
from kvops.explain.memory import Figure
from kvops.explain.run import Run
from kvops.plan import PlanInputs, WayOut
from kvops.planner import plan
from kvops.policy import Level
from kvops.profile import Profile
from kvops.units import format_bytes

LOG_GIB_ROUNDING = (1 << 30) // 200  # a GiB figure of two decimals is off by up to 0.005 GiB


@dataclass
class Action:
    """The one next action, and who computed it."""

    change: str | None
    result: str
    source: str  # planner | engine message | policy | none
    warning: str | None = None
    flags: dict[str, Any] | None = None
    problem: str | None = None  # the planner's need-against-have for the run as it is
    ways_out: tuple[WayOut, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ways_out"] = [way.to_dict() for way in self.ways_out]
        return data


def next_action(
    run: Run,
    inputs: PlanInputs | None,
    kv: KvNow | None,
    level: Level | None,
    diagnosis: Diagnosis | None,
    figures: list[Figure],
    notes: list[str],
    capacity: VllmCapacity | None = None,
) -> Action:
    """`capacity`: the predicted plan's pool, whose block bytes make a log's block count exact."""
    if diagnosis is not None:
        return _failure_action(run, inputs, diagnosis, figures, notes, capacity)
    if kv is None or level is None:
        return Action(None, "no live KV usage to act on: give --metrics URL for the level and headroom", "none")
    if level <= Level.OK:
        return Action(None, f"none: KV at {kv.usage:.1%}, under the warn level ({kv.warn_level:.0%})", "policy")
    if inputs is None:
        return Action(None, f"KV at {kv.usage:.1%} ({level.label}): give --model for the planner's way out", "none")
    demand = max(1, ceil((kv.running or 0) + (kv.waiting or 0)))
    pool = kv.pool_bytes or run.pinned_kv_bytes
    changed = (
        replace(inputs, concurrency=demand, kv_cache_memory_bytes=pool, gpu=None, profile=None)
        if pool
        else replace(inputs, concurrency=demand)
    )
    action = _planner(changed, notes)
    if action is None:
        return Action(
            None,
            f"the planner fits {demand} requests of {kv.request_tokens} tokens under the warn level in this pool, yet KV is at "
            f"{kv.usage:.1%}: the requests are larger than planned; give their real size (--prompt-tokens/--gen-tokens or --workload)",
            "planner",
        )
    return action


def _failure_action(
    run: Run,
    inputs: PlanInputs | None,
    diagnosis: Diagnosis,
    figures: list[Figure],
    notes: list[str],
    capacity: VllmCapacity | None,
) -> Action:
    failure = run.failure
    if isinstance(failure, StartupFreeMemory) and failure.total_bytes > 0:  # a log is input: 0/0 GiB is no advice
        fraction = floor(failure.startup_free_bytes / failure.total_bytes * 100) / 100
        return Action(
            f"--gpu-memory-utilization {fraction:.2f}",
            f"fits the {format_bytes(failure.startup_free_bytes)} free at startup; or free the "
            f"{format_bytes(diagnosis.figures['held_by_others_bytes'])} other processes hold",
            "engine message",
        )
    if inputs is not None:
        action = _planner(
            _replan_inputs(run, inputs, diagnosis, figures, capacity), notes, pinned_by_user=bool(run.pinned_kv_bytes)
        )
        if action is not None:
            return action
    return _engine_advice(run, diagnosis, inputs)


def _replan_inputs(
    run: Run, inputs: PlanInputs, diagnosis: Diagnosis, figures: list[Figure], capacity: VllmCapacity | None
) -> PlanInputs:
    """The run as the planner must see it to reproduce the failure: its measured terms (weights, and the overhead
    its budget implies) when the log states its budget, else its real KV pool pinned."""
    failure = run.failure
    if not isinstance(failure, (KvTooSmall, KvTokensTooFew, NoKvMemory)):
        return inputs
    by_name = {item.name: item for item in figures}
    total, requested, weights, kv = (
        by_name["total"].bytes,
        by_name["requested"].bytes,
        by_name.get("weights"),
        by_name["kv_cache"],
    )
    if (
        total
        and requested
        and weights is not None
        and weights.basis == "reported"
        and weights.bytes is not None
        and kv.bytes is not None
        and not run.pinned_kv_bytes
    ):
        if run.log is not None and run.log.extensible:
            profile = _measured_terms(run, inputs, total, weights.bytes, by_name.get("before_engine"))
        else:
            overhead = requested - weights.bytes - _logged_blocks_bytes(run, kv.bytes, capacity)
            profile = Profile(
                "vllm",
                run.log_source or "the log",
                tp=inputs.tp,
                total_memory_bytes=total,
                weights_bytes=weights.bytes,
                overhead_bytes=max(0, overhead),
            )
        return replace(inputs, profile=profile, kv_cache_memory_bytes=None, concurrency=None)
    pool = run.pinned_kv_bytes or diagnosis.figures.get("available_bytes") or run.facts.get("kv_cache_bytes")
    if pool and pool > 0:
        return replace(
            inputs,
            kv_cache_memory_bytes=pool,
            gpu=None,
            profile=None,
            concurrency=None,
            max_model_len=inputs.max_model_len if isinstance(failure, NoKvMemory) else failure.max_model_len,
        )
    return inputs


def _measured_terms(run: Run, inputs: PlanInputs, total: int, weights: int, before: Figure | None) -> Profile:
    """An extensible KV cache's run, term by term: its budget less weights and KV also holds vLLM's margin and
    what was in use before startup, which the planner's extensible sizing takes apart (an overhead would count
    them twice)."""
    assert run.log is not None
    return Profile(
        "vllm",
        run.log_source or "the log",
        tp=inputs.tp,
        total_memory_bytes=total,
        weights_bytes=weights,
        activation_bytes=run.log.activation_bytes,
        non_torch_bytes=run.log.non_torch_bytes,
        cudagraph_bytes=run.facts.get("cudagraph_captured_bytes"),
        startup_used_bytes=before.bytes if before is not None else None,
    )


def _logged_blocks_bytes(run: Run, logged: int, capacity: VllmCapacity | None) -> int:
    """The KV bytes a log states in GiB to two decimals (+-5 MiB), narrowed by the block count it also states
    ('# GPU blocks: 80') where the two agree in the plan's block bytes: vLLM cut the pool into
    floor(bytes / block bytes) blocks, so the middle of the bytes that make that many blocks re-plans the run's own
    count (80, where the rounded 0.39 GiB made 79)."""
    blocks = run.facts.get("num_gpu_blocks")
    if not blocks or capacity is None:
        return logged
    per_block = capacity.bytes_per_block
    least = blocks * per_block
    if not (least <= logged + LOG_GIB_ROUNDING and logged - LOG_GIB_ROUNDING < least + per_block):
        return logged
    return least + per_block // 2


def _planner(inputs: PlanInputs, notes: list[str], pinned_by_user: bool = False) -> Action | None:
    """The planner's next action for a run that does not fit; None when the planner finds it fits as it is.

    A pinned KV pool (`--kv-cache-memory-bytes`) too small for the plan: the size the plan needs. Otherwise the
    first way out that fits, in the planner's order (quantized KV, more tp, more replicas, a larger GPU); a shorter
    context only when it still holds the planned request size, else as the last resort it is (it changes what the
    service accepts). `--concurrency auto` is not a change to the deployment and is never chosen."""
    try:
        result = plan(inputs)
    except KvopsError as exc:
        notes.append(f"the planner could not re-plan this run: {exc}")
        return None
    if result.fits:
        return None
    if pinned_by_user and result.need_bytes and result.kv_cache_bytes < result.need_bytes:
        return Action(
            f"--kv-cache-memory-bytes {result.need_bytes}",
            f"the KV pool the plan needs ({format_bytes(result.need_bytes)}; the run pinned "
            f"{format_bytes(result.kv_cache_bytes)})",
            "planner",
            problem=result.problem,
            ways_out=result.ways_out,
        )
    ways = [way for way in result.ways_out if not way.change.startswith("--concurrency")]
    wanted = inputs.workload.total_tokens

    def keeps_the_requests(way: WayOut) -> bool:
        return way.change != "--max-model-len auto" or bool(
            wanted and way.flags and way.flags["max-model-len"] >= wanted
        )

    # the last resort: the longest context that starts, though shorter than the requests (the planner does not
    # count it as fitting the workload; its flags are the re-planned ones)
    shorter = next((way for way in ways if way.change == "--max-model-len auto" and way.flags), None)
    chosen = next((way for way in ways if way.fits and keeps_the_requests(way)), None) or shorter
    if chosen is None:
        tried = ", ".join(way.change for way in ways if way.fits is False)
        return Action(
            None, f"no single change fits (tried {tried})", "planner", problem=result.problem, ways_out=result.ways_out
        )
    warning = chosen.warning
    flags = dict(chosen.flags) if chosen.flags is not None else None
    if not keeps_the_requests(chosen) and flags:
        warning = (
            f"requests longer than {flags['max-model-len']:,} tokens are rejected; nothing else the planner tried fits"
        )
    return Action(_concrete(chosen), chosen.result, "planner", warning, flags, result.problem, result.ways_out)


def _concrete(way: WayOut) -> str:
    """'--max-model-len auto' as the value the planner chose."""
    if way.change == "--max-model-len auto" and way.flags:
        return f"--max-model-len {way.flags['max-model-len']}"
    return way.change


# The highest --gpu-memory-utilization explain suggests: the rest of the device is the CUDA graphs' and the driver's.
MAX_UTILIZATION = 0.98
LOG_SLACK = 16 << 20  # vLLM logs GiB with two decimals (+-5 MiB): ask for a little more than the shortfall


def _more_memory(run: Run, diagnosis: Diagnosis, inputs: PlanInputs | None, why: str) -> Action:
    """Nothing was left for the KV cache (a negative or zero available KV): the budget must grow (a higher
    utilization, while there is device memory to give) or the weights shrink per GPU; a lower utilization would
    leave even less."""
    figures = diagnosis.figures
    available, requested = figures.get("available_bytes"), figures.get("requested_bytes")
    utilization = run.facts.get("gpu_memory_utilization") or (inputs.memory_fraction if inputs else None)
    if available is not None and requested and utilization:
        total = requested / utilization
        higher = ceil((utilization + (LOG_SLACK - available) / total) * 100) / 100
        if higher <= MAX_UTILIZATION:
            return Action(
                f"--gpu-memory-utilization {higher:.2f}",
                f"raises the budget by {format_bytes(ceil((higher - utilization) * total))}: the weights and overheads "
                f"took all of it ({format_bytes(max(0, -available))} short){why}",
                "engine message",
            )
    return Action(
        "--tensor-parallel-size 2",
        f"the weights and overheads take the whole device: split the weights over more GPUs, or a larger GPU or "
        f"--quantization{why}",
        "engine message",
    )


def _engine_advice(run: Run, diagnosis: Diagnosis, inputs: PlanInputs | None) -> Action:
    """What the engine's own message and figures say to change, when the planner has no way out to offer."""
    failure, figures = run.failure, diagnosis.figures
    why = "" if inputs else " (give --model for the planner's ways out)"
    length = (
        failure.estimated_max_model_len
        if isinstance(failure, KvTooSmall)
        else failure.kv_tokens
        if isinstance(failure, KvTokensTooFew)
        else None
    )
    if length:
        return Action(
            f"--max-model-len {length}", f"the longest context the engine's own figures fit{why}", "engine message"
        )
    if isinstance(failure, NoKvMemory):
        return _more_memory(run, diagnosis, inputs, why)
    if diagnosis.term == "other_processes":
        return Action(
            None,
            f"free the {format_bytes(figures['held_by_others_bytes'])} other processes hold on the device, or lower --gpu-memory-utilization",
            "engine message",
        )
    advice = {
        "weights": (
            "--tensor-parallel-size 2",
            "split the weights over more GPUs (or --quantization, or a larger GPU)",
        ),
        "activation": (
            "--max-num-seqs / --max-num-batched-tokens lower",
            "the profile run and sampler warm-up size their peak from these",
        ),
        "cuda_graphs": ("--enforce-eager", "no CUDA graphs (or lower --gpu-memory-utilization to leave them room)"),
        "kv_cache": ("--gpu-memory-utilization lower", "a smaller KV pool leaves the allocation room"),
    }.get(diagnosis.term)
    if diagnosis.term == "kv_cache" and figures.get("shortfall_bytes") and figures.get("total_bytes"):
        utilization = run.facts.get("gpu_memory_utilization") or (inputs.memory_fraction if inputs else None)
        if utilization:
            lower = floor((utilization - figures["shortfall_bytes"] / figures["total_bytes"]) * 100) / 100
            return Action(
                f"--gpu-memory-utilization {lower:.2f}",
                f"leaves the {format_bytes(figures['shortfall_bytes'])} the allocation lacked{why}",
                "engine message",
            )
    if advice:
        return Action(advice[0], advice[1] + why, "engine message")
    return Action(None, "the log does not show which term ran out" + why, "none")
