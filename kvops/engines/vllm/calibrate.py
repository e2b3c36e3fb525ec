"""Calibrating a vLLM run: what its startup log and its live cache config measured, against the plan, term by
term; the profile that replaces the planner's estimates; and the observation the corpus fit takes from it."""

from __future__ import annotations

import re
from typing import Any

from kvops.calibration import Calibration, Comparison, predicted_figures
from kvops.engines.device_total import device_total, engine_total
from kvops.engines.vllm import budget
from kvops.engines.vllm.capacity import VllmCapacity
from kvops.engines.vllm.logs import VllmLog
from kvops.engines.vllm.metrics import CacheConfig
from kvops.engines.vllm.releases import VllmRelease, release
from kvops.engines.weights import weight_format
from kvops.gpus import find_gpu, gpu_catalog
from kvops.overheads import Observation
from kvops.plan import Plan
from kvops.profile import Profile
from kvops.units import format_bytes

# A log's total may differ from the catalog's by a driver's reserve; beyond this it is another GPU.
OTHER_GPU_SHARE = 0.02


def calibrate(log: VllmLog | None, config: CacheConfig | None, plan: Plan | None, source: str) -> Calibration:
    predicted = predicted_figures(plan)
    facts = log.facts if log else {}
    lines = log.lines if log else {}
    metric = "vllm:cache_config_info"
    rows: list[Comparison] = []
    notes: list[str] = []
    warnings: list[str] = []
    run_release = _release(log, plan)

    def add(term: str, unit: str, actual: Any, where: str) -> None:
        if actual is not None:
            rows.append(Comparison(term, unit, predicted.get(term), actual, where))

    pinned = plan.inputs.kv_cache_memory_bytes if plan else _label(config, "kv_cache_memory_bytes")
    kv_actual = facts.get("kv_cache_bytes")
    kv_where = lines.get("kv_cache_bytes", "")
    if pinned and (kv_actual is None or abs(kv_actual - pinned) < 0.01 * (1 << 30)):
        kv_actual, kv_where = pinned, "--kv-cache-memory-bytes (vLLM allocates exactly this)"
    total = facts.get("total_memory_bytes") if log and log.device != "cpu" else None
    # without a plan, the part whose total the log printed: a profile without its GPU gave every GPU's plan that total
    run_gpu = plan.inputs.gpu.id if plan and plan.inputs.gpu else (gpu_of_total(total) if total else None)
    if total and plan and plan.inputs.gpu:
        other = _other_gpu(total, plan)
        if other:
            warnings += other
            run_gpu = gpu_of_total(total)
        elif plan.inputs.gpu.id == "custom":  # no --gpu: the part whose total the log printed, where one is
            run_gpu = gpu_of_total(total) or run_gpu
    planned_total = plan.term("total") if plan else None
    plan_total = total or (planned_total.bytes if planned_total else None)
    util = run_utilization(log, config, plan, run_release)
    extensible = bool(log and log.extensible)
    cudagraph = _cuda_graphs(log, plan_total)

    add("weights", "bytes", facts.get("weights_bytes"), lines.get("weights_bytes", ""))
    add(
        "activation",
        "bytes",
        log.activation_bytes if log else None,
        lines.get("activation_bytes") or lines.get("peak_torch_bytes", ""),
    )
    add("non_torch", "bytes", log.non_torch_bytes if log else None, lines.get("non_torch_bytes", ""))
    graph_line = "cudagraph_captured_bytes" if extensible else "cudagraph_bytes"
    add("cuda_graphs", "bytes", cudagraph, lines.get(graph_line) or lines.get("cudagraph_utilization", ""))
    overhead = None
    # under the extensible KV cache, budget - weights - KV also holds vLLM's margin and the memory in use before
    # startup (measure_kv_cache_bytes): not the activation + non-torch + CUDA graphs the overhead stands for
    if (
        not pinned
        and not extensible
        and plan_total
        and facts.get("weights_bytes") is not None
        and kv_actual is not None
    ):
        overhead = budget.requested_memory(plan_total, util, run_release) - facts["weights_bytes"] - kv_actual
        source_total = "the log's total_gpu_memory" if total else "the engine-side total of the plan's GPU"
        add("overhead", "bytes", overhead, f"{source_total} x {util:g} - weights - available KV cache")
    startup_used = _startup_used(log, total)
    if extensible or predicted.get("startup_used") is not None:  # the term only the extensible KV cache sizes with
        add("startup_used", "bytes", startup_used, lines.get("startup_free_bytes", ""))
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
    notes.append(f"the run's release: {run_release.label} ({run_release.how})")
    if plan is not None and plan.inputs.pp > 1:
        warnings.append(_stage_warning(plan.inputs.pp, kv_where or lines.get("weights_bytes", "")))
    if plan is None:
        notes.append("no prediction: give --model (and --gpu) for the run to compare against the planner")

    profile = Profile(
        engine="vllm",
        source=source,
        model=(log.args.get("model") if log else None) or (plan.inputs.spec.name if plan else None),
        gpu=run_gpu,
        engine_version=_version_text(run_release),
        tp=(log.args.get("tensor_parallel_size") if log else None) or (plan.inputs.tp if plan else None),
        max_num_batched_tokens=(log.args.get("max_num_batched_tokens") if log else None)
        or (plan.capacity.max_num_batched_tokens if plan and isinstance(plan.capacity, VllmCapacity) else None),
        total_memory_bytes=total,
        gpu_memory_utilization=util if not pinned else None,
        weights_bytes=facts.get("weights_bytes"),
        activation_bytes=log.activation_bytes if log else None,
        non_torch_bytes=log.non_torch_bytes if log else None,
        cudagraph_bytes=cudagraph,
        cudagraph_captures=log.facts.get("cudagraph_captures") if log and cudagraph is not None else None,
        overhead_bytes=overhead if overhead is not None and overhead >= 0 else None,
        startup_used_bytes=startup_used,
        kv_cache_bytes=kv_actual,
        num_gpu_blocks=blocks,
        block_size=_label(config, "block_size") or (log.args.get("block_size") if log else None),
    )
    return Calibration("vllm", source, rows, profile, notes, warnings)


def _startup_used(log: VllmLog | None, total: int | None) -> int | None:
    """Memory in use before vLLM's startup snapshot (the CUDA context, NCCL, other processes): the log's total less
    the memory free at startup, which the extensible KV cache's headroom starts from (measure_kv_cache_bytes)."""
    free = log.get("startup_free_bytes") if log else None
    return total - free if total and free is not None and 0 <= total - free < total else None


def _cuda_graphs(log: VllmLog | None, total: int | None) -> int | None:
    """The CUDA-graph memory the run's KV sizing took: vLLM's estimate (0.21-0.33, 0.34 without the extensible KV
    cache), or, under the extensible KV cache, the graphs it captured, resident when it measured free memory
    (profile_cudagraph_memory returns 0 there: v1/worker/gpu/model_runner.py l.1123, 0.34.0)."""
    if log is None:
        return None
    if log.extensible:
        return log.get("cudagraph_captured_bytes")
    return log.cudagraph_bytes(total)


def run_utilization(
    log: VllmLog | None, config: CacheConfig | None, plan: Plan | None, run_release: VllmRelease
) -> float:
    """The utilization the run had: its log's figure, its non-default args, what the plan was told, its live cache
    config, else its release's default."""
    stated = (
        (log.get("gpu_memory_utilization") if log else None)
        or (log.args.get("gpu_memory_utilization") if log else None)
        or (plan.inputs.memory_fraction if plan else None)
        or _number(config, "gpu_memory_utilization")
    )
    if isinstance(stated, (int, float)) and not isinstance(stated, bool) and 0 < stated <= 1:  # a log is input
        return float(stated)
    return run_release.default_gpu_memory_utilization


def observation(log: VllmLog, plan: Plan, source: str) -> Observation | None:
    """What the log measured of the terms kvops estimates, beside kvops' own model of the same launch; None when it
    measured none of them (or the launch pinned its KV cache, which skips the profile). With pipeline parallelism
    the memory lines are the first worker's, one stage's (its layers, no logits), while kvops models the stage that
    binds the pool: only the CUDA-graph estimate is taken from such a log."""
    inputs, capacity = plan.inputs, plan.capacity
    if not isinstance(capacity, VllmCapacity) or plan.release is None or inputs.kv_cache_memory_bytes is not None:
        return None
    run_release: VllmRelease = plan.release  # type: ignore[assignment]
    if inputs.pp > 1:
        return graph_observation(log, source, run_release)
    if run_release.extensible or log.extensible:
        # the extensible KV cache prints no profile terms, only its measurement after warmup: its family plans with
        # the profiler family's terms (releases.FALLBACKS) until its logs' own terms are read
        return None
    scope = weight_format(inputs.spec, inputs.quantization).scope
    forward, logits, workspace = budget.profile_run(
        inputs.spec, capacity.max_num_batched_tokens, capacity.sampler_sequences, inputs.tp, scope, inputs.text_only
    )
    runner = budget.model_runner_of(inputs, run_release, bool(log.get("model_runner_v2")))
    fitted, held = budget.sampler_run(inputs, runner, logits, workspace)
    facts = log.facts
    graphs_applied = run_release.cudagraphs_before_kv and not inputs.enforce_eager
    graphs = log.cudagraph_estimate_applied if graphs_applied else log.get("cudagraph_bytes")
    total = facts.get("total_memory_bytes") or device_total(inputs)
    # An overhead read as budget - weights - KV is a measurement only on a known device total: on kvops' estimate
    # (a GPU no log has shown torch's total for) it carries the estimate's error, which is the total's, not the terms'.
    known_total = facts.get("total_memory_bytes") is not None or _total_basis(plan) != "estimate"
    overhead = None
    requested = budget.requested_memory(total, run_utilization(log, None, plan, run_release), run_release)
    if known_total and facts.get("weights_bytes") is not None and facts.get("kv_cache_bytes") is not None:
        overhead = requested - facts["weights_bytes"] - facts["kv_cache_bytes"]
    found = Observation(
        source,
        run_release.family,
        inputs.tp,
        forward,
        fitted,
        held,
        activation=log.activation_bytes,
        non_torch=log.non_torch_bytes,
        cuda_graphs=graphs,
        cuda_graphs_applied=graphs_applied,
        graph_share=graph_share(log),
        overhead=overhead if log.activation_bytes is None or log.non_torch_bytes is None else None,
        budget=requested,
        gpu=inputs.gpu.id if inputs.gpu else None,
        custom_all_reduce=budget.custom_all_reduce(inputs)[0],
    )
    return found if found.total is not None or found.activation is not None or found.non_torch is not None else None


def _stage_warning(pp: int, line: str) -> str:
    """Each pipeline stage's worker prints its own memory lines; a log keeps whichever came first."""
    worker = re.search(r"Worker_PP\d+", line)
    printed = worker.group(0) if worker else "one worker"
    return (
        f"pipeline parallel {pp}: the log's memory lines are one stage's ({printed}), kvops' terms those of the "
        "stage that binds the pool (`kvops plan --explain` names it): compare the KV tokens and concurrency lines, "
        "which are the engine's pool, or calibrate on the binding stage's own lines"
    )


def _total_basis(plan: Plan) -> str | None:
    term = plan.term("total")
    return term.basis if term is not None else None


def _release(log: VllmLog | None, plan: Plan | None) -> VllmRelease:
    found = log.release() if log else None
    if found is not None:
        return found
    if plan is not None and plan.release is not None:
        return plan.release  # type: ignore[return-value]
    return release(None)


def _version_text(run_release: VllmRelease) -> str:
    return f"{run_release.version}{'-v0' if run_release.v0 and run_release.version.at_least(0, 8) else ''}"


def _other_gpu(total: int, plan: Plan) -> list[str]:
    """The log's device total is not the one of the GPU the calibration names (the catalog part's, as the engine
    sees it): the profile would carry another part's figures."""
    gpu = plan.inputs.gpu
    assert gpu is not None
    if gpu.id == "custom":
        return []
    seen = engine_total(gpu.id)
    expected = seen.bytes if seen else find_gpu(gpu.id).memory_bytes
    if abs(total - expected) <= OTHER_GPU_SHARE * expected:
        return []
    return [
        f"the log's device total is {format_bytes(total)}, not a {gpu.id}'s ({format_bytes(expected)}): it ran on "
        f"another GPU ({gpu_of_total(total) or 'not in the catalog'}); the profile records that GPU and its total, and "
        f"plans for a {gpu.id} take the {gpu.id}'s own total"
    ]


def gpu_of_total(total: int) -> str | None:
    """The catalog GPU whose engine-side total is nearest this one (within the driver's share), or None when none
    is. Nearest, not first: an H100's 79.19 GiB is also within an A100-80GB's share."""
    nearest: tuple[float, str] | None = None
    for gpu in gpu_catalog():
        seen = engine_total(gpu.id)
        expected = seen.bytes if seen else gpu.memory_bytes
        off = abs(total - expected) / expected
        if off <= OTHER_GPU_SHARE and (nearest is None or off < nearest[0]):
            nearest = (off, gpu.id)
    return nearest[1] if nearest else None


def _label(config: CacheConfig | None, name: str) -> int | None:
    return config.integer(name) if config else None


def _number(config: CacheConfig | None, name: str) -> float | None:
    return config.number(name) if config else None


def graph_observation(log: VllmLog, source: str, run_release: VllmRelease) -> Observation | None:
    """A log's CUDA-graph estimate alone, for a launch kvops cannot plan (another model, speculative decoding): the
    estimate vLLM takes before sizing KV depends on the capture sizes far more than on the model."""
    if not run_release.cudagraphs_before_kv or log.cudagraph_estimate_applied is None:
        return None
    return Observation(
        source,
        run_release.family,
        1,
        0,
        cuda_graphs=log.cudagraph_estimate_applied,
        cuda_graphs_applied=True,
        graph_share=graph_share(log),
    )


def graph_share(log: VllmLog) -> float:
    """The run's capture sizes over the default ones the fitted estimate stands for, where its config line lists
    them (else taken as the default)."""
    captures = log.facts.get("cudagraph_captures")
    return captures / budget.DEFAULT_CAPTURES if captures else 1.0
