"""The planner: one deployment in, its plan out; when the workload does not fit, the ways out, each re-planned.

Engine-neutral: each engine's adapter (`kvops.engines.get(name)`) computes a plan and says which changes it
supports (quantized KV dtypes, data-parallel replicas, offloading); the search over them is here. Pure.
"""

from __future__ import annotations

import re
from dataclasses import replace
from math import ceil

from kvops import engines
from kvops.dtypes import resolve_kv_dtype
from kvops.engines import common
from kvops.errors import KvopsError, UsageError
from kvops.formula import check_tp
from kvops.frozen import frozen
from kvops.gpus import Gpu, gpu_catalog
from kvops.model.spec import ModelSpec
from kvops.plan import Plan, PlanInputs, WayOut
from kvops.units import format_bytes

TENSOR_PARALLEL_SIZES = (2, 4, 8)


def plan(inputs: PlanInputs) -> Plan:
    """Plan one deployment; when it does not fit, also compute the ways out."""
    result = predict(inputs)
    if result.fits:
        return result
    return replace(result, ways_out=tuple(ways_out(inputs, result)))


def predict(inputs: PlanInputs) -> Plan:
    """The plan alone, without searching for ways out (calibration, sweeps, ways out themselves)."""
    engine = engines.get(inputs.engine)
    if inputs.devices % inputs.gpus_per_replica:
        if inputs.pp > 1:
            raise UsageError(
                f"--gpus {inputs.devices} is not a multiple of --tp {inputs.tp} x --pp {inputs.pp}: each replica takes tp x pp GPUs"
            )
        raise UsageError(f"--gpus {inputs.devices} is not a multiple of --tp {inputs.tp}: each replica takes tp GPUs")
    return engine.plan_once(inputs)


def ways_out(inputs: PlanInputs, failed: Plan) -> list[WayOut]:
    """Re-plan with each change a user can make; report what each one gives.

    In the order a user should try them: the lossless ways first (more tensor parallelism, more replicas, a larger
    GPU, a shorter context), then quantized KV from the least lossy (int8, then fp8, then int4), each with its
    quality warning and the engine's own spelling, then host memory."""
    engine = engines.get(inputs.engine)
    options: list[WayOut] = []
    if inputs.device == "gpu":  # the ways that add or change devices: a CPU build runs where it runs
        options += _more_tensor_parallel(inputs)
        if engine.data_parallel:
            options += _more_replicas(inputs, failed)
        options += _larger_gpu(inputs)
    if not isinstance(inputs.max_model_len, str) and not isinstance(inputs.concurrency, str):
        options.append(_shorter_context(inputs))
    if isinstance(inputs.concurrency, int):
        options.append(_try("--concurrency auto", replace(inputs, concurrency="auto")))
    if resolve_kv_dtype(inputs.kv_dtype, inputs.spec.dtype).bits >= 16:
        for name in engine.kv_dtype_ways(inputs):
            warning = f"{engine.kv_dtype_spelling(inputs, name)}: {common.QUALITY_WARNING}"
            options.append(_try(f"--kv-dtype {name}", replace(inputs, kv_dtype=name), warning))
    options += engine.offload_ways(inputs, failed)
    return options


def _try(change: str, changed: PlanInputs, warning: str | None = None) -> WayOut:
    try:
        result = predict(changed)
    except KvopsError as exc:
        return WayOut(change, False, str(exc), warning)
    if not result.fits:
        return WayOut(change, False, f"still does not fit: {result.problem}", warning, replanned=True)
    cap = result.capacity
    assert cap is not None  # a plan that fits has sized its pool
    requests = f"{cap.requests_under_warn} {_plural('request', cap.requests_under_warn)} of {cap.request_tokens} tokens"
    if cap.requests_under_warn < 1:  # the engine starts, but the first planned request takes it past the warn level
        return WayOut(change, False, f"still short: {requests} under the warn level", warning, replanned=True)
    summary = f"fits: {cap.kv_tokens:,} KV tokens, {requests} under the warn level, max-model-len {cap.max_model_len}"
    return WayOut(change, True, summary, warning, result.flags, replanned=True)


def _consumer(gpu: Gpu) -> bool:
    """A GeForce card (RTX-3090, RTX-4090, RTX-5090): not what a data-center fleet can swap in."""
    return re.fullmatch(r"RTX-\d{4}", gpu.id) is not None


def _plural(word: str, count: int) -> str:
    return word if count == 1 else f"{word}s"


def _shorter_context(inputs: PlanInputs) -> WayOut:
    """--max-model-len auto: a way out only when the context it finds still holds the planned requests (the
    workload's, else the --max-model-len asked for): a shorter context would reject them."""
    option = _try("--max-model-len auto", replace(inputs, max_model_len="auto"))
    wanted = inputs.workload.total_tokens or (inputs.max_model_len if isinstance(inputs.max_model_len, int) else None)
    found = option.flags.get("max-model-len", option.flags.get("max-total-tokens")) if option.flags else None
    if option.fits and wanted and found is not None and found < wanted:
        result = (
            f"the longest context that fits, {found} tokens, is shorter than the planned requests of {wanted} tokens"
        )
        return replace(option, fits=False, result=result)
    return option


def _more_tensor_parallel(inputs: PlanInputs) -> list[WayOut]:
    """Each larger tensor-parallel size the model's heads split by, up to the first that fits."""
    options = []
    for tp in TENSOR_PARALLEL_SIZES:
        if tp <= inputs.tp:
            continue
        try:
            check_tp(inputs.spec, tp)
        except KvopsError:
            continue
        option = _try(f"--tp {tp}", replace(inputs, tp=tp, gpus=tp * inputs.pp * inputs.replicas))
        options.append(option)
        if option.fits:
            break
    return options


def _more_replicas(inputs: PlanInputs, failed: Plan) -> list[WayOut]:
    """More data-parallel replicas: the same engine on more GPUs, the concurrency split between them."""
    per_replica = failed.capacity.requests_under_warn if failed.capacity else 0
    if not isinstance(inputs.concurrency, int) or per_replica < 1 or inputs.concurrency <= per_replica:
        return []
    factor = ceil(inputs.concurrency / per_replica)
    gpus = inputs.devices * factor
    share = ceil(inputs.concurrency / factor)
    option = _try(f"--gpus {gpus}", replace(inputs, gpus=gpus, concurrency=share))
    if option.fits:
        stages = f" x pp {inputs.pp}" if inputs.pp > 1 else ""
        option = replace(
            option,
            result=f"fits: {gpus // inputs.gpus_per_replica} replicas of tp {inputs.tp}{stages}, {share} of the {inputs.concurrency} requests each ({per_replica} fit one replica under the warn level)",
        )
    return [replace(option, replicas=gpus // inputs.gpus_per_replica, concurrency_per_replica=share)]


def _larger_gpu(inputs: PlanInputs) -> list[WayOut]:
    """The smallest catalog GPU with more memory on which the plan fits, from the user's vendor (its software stack)
    and, for a data-center card, not a consumer one."""
    if inputs.gpu is None:
        return []
    current = inputs.gpu
    candidates = [
        gpu
        for gpu in gpu_catalog()
        if gpu.memory_bytes > current.memory_bytes
        and gpu.vendor == current.vendor
        and (_consumer(current) or not _consumer(gpu))
    ]
    # --gpu-memory overrides whatever --gpu names: the way out is the other GPU without it
    without = " without --gpu-memory" if current.reported_by == "--gpu-memory" else ""
    for gpu in sorted(candidates, key=lambda gpu: gpu.memory_bytes):
        option = _try(f"--gpu {gpu.id}{without}", replace(inputs, gpu=gpu, profile=None))
        if option.fits:
            return [option]
    return []


@frozen
class KvBudget:
    """The KV memory an engine's plan leaves for one model on one device: what `kvops plot` draws."""

    model: str
    engine: str
    gpu: str
    memory_fraction: float | None
    kv_cache_bytes: int  # what the capacity is sized on, as Plan.kv_cache_bytes: the engine's KV less margin_bytes
    basis: str
    margin_bytes: int = 0  # kvops' margin below the engine's predicted KV

    @property
    def label(self) -> str:
        return f"KV budget: {self.basis}"

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "engine": self.engine,
            "gpu": self.gpu,
            "memory_fraction": self.memory_fraction,
            # as `kvops plan --json` names them: the engine's predicted KV, the margin, the line drawn
            "kv_cache_bytes": self.kv_cache_bytes + self.margin_bytes,
            "margin_bytes": self.margin_bytes,
            "capacity_kv_bytes": self.kv_cache_bytes,
            "basis": self.basis,
        }


def kv_budget(
    spec: ModelSpec, gpu: Gpu, engine: str, tp: int, kv_dtype: str, memory_fraction: float | None, max_model_len: int
) -> KvBudget:
    """The KV bytes a plan for `spec` leaves on `gpu` (the total less weights and the engine's overheads)."""
    length = min(max_model_len, spec.max_position_embeddings or max_model_len)
    inputs = PlanInputs(
        engine, spec, gpu, tp=tp, max_model_len=length, kv_dtype=kv_dtype, memory_fraction=memory_fraction
    )
    result = predict(inputs)
    adapter = engines.get(engine)
    fraction = result.flags.get(adapter.memory_fraction_flag)
    setting = f"--{adapter.memory_fraction_flag} {fraction:g}" if fraction is not None else ""
    if fraction is None:  # left unset (vLLM 0.34's extensible KV cache): the share the plan requested
        requested, total = result.term("requested"), result.term("total")
        fraction = round(requested.bytes / total.bytes, 4) if requested and total and total.bytes else 1.0
        setting = f"--{adapter.memory_fraction_flag} unset ({fraction:g})"
    kv = max(result.kv_cache_bytes, 0)
    margin = max(result.engine_kv_bytes, 0) - kv
    basis = f"{adapter.title} {setting} on {gpu.id}: {format_bytes(kv)} for {spec.name}"
    return KvBudget(spec.name, engine, gpu.id, fraction, kv, basis, margin)
