"""The capacity planner: a model, a GPU and a workload in; engine flags, every memory term and the capacity out.

Pure: the CLI reads files and prints; this module only computes. `plan(inputs)` returns a `Plan` whether or not
the workload fits; when it does not, `plan.problem` states need against have and `plan.ways_out` lists the
changes the planner itself re-planned and found to work (or not).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import ceil, floor
from typing import Any

from kvops import budget as common
from kvops.budget import Term
from kvops.dtypes import KvDtype, resolve_kv_dtype
from kvops.engines.flags import flag_args
from kvops.engines.tgi import budget as tgi
from kvops.engines.tgi import flags as tgi_flags
from kvops.engines.vllm import budget as vllm
from kvops.engines.vllm import flags as vllm_flags
from kvops.errors import KvopsError, UsageError
from kvops.formula import check_tp
from kvops.gpus import Gpu, gpu_catalog
from kvops.model.spec import ModelSpec
from kvops.profile import Profile
from kvops.units import format_bytes
from kvops.workload import Workload

ENGINES = ("vllm", "tgi")
QUALITY_WARNING = "quantized KV costs quality on long generations (the seeds' warning): evaluate before serving"
PCIE_BYTES_PER_SECOND = 25 * 10**9  # PCIe 4.0 x16, what host<->GPU copies reach in practice (an estimate)


class PlanError(KvopsError):
    """The workload does not fit; the message holds need vs have and the ways out."""

    exit_code = 3


# --- inputs ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanInputs:
    engine: str
    spec: ModelSpec
    gpu: Gpu | None
    tp: int = 1
    gpus: int | None = None  # devices in all; replicas = gpus / tp
    device: str = "gpu"  # vLLM only: "cpu" plans for the CPU build (block size 128, no async scheduling)
    max_model_len: int | str | None = None  # tokens, "auto", or None for the model's max_position_embeddings
    workload: Workload = field(default_factory=Workload)
    concurrency: int | str | None = None  # requests, "auto", or None
    kv_dtype: str = "auto"
    quantization: str = "auto"
    memory_fraction: float | None = None  # vLLM --gpu-memory-utilization / TGI --cuda-memory-fraction
    kv_cache_memory_bytes: int | None = None  # vLLM --kv-cache-memory-bytes
    batched_tokens: int | None = None  # vLLM --max-num-batched-tokens / TGI --max-batch-prefill-tokens
    max_num_seqs: int | None = None  # vLLM --max-num-seqs / TGI --max-concurrent-requests
    block_size: int | None = None
    enforce_eager: bool = False
    guard: bool | None = None  # vLLM's KV-guard scheduler; None: on for vLLM (TGI has no scheduler plugin)
    launcher: tuple[
        str, ...
    ] = ()  # replaces the engine's program, e.g. ("python", "-m", "vllm.entrypoints.openai.api_server")
    max_queued: int | None = None  # vLLM --max-num-queued-reqs
    max_input_tokens: int | None = None  # TGI
    profile: Profile | None = None
    warn_level: float = 0.70


# --- result ---------------------------------------------------------------------------------------------


@dataclass
class Plan:
    inputs: PlanInputs
    memory: list[Term]
    kv_cache_bytes: int
    capacity: dict[str, Any]
    flags: dict[str, Any]
    args: list[str]  # the engine's arguments, after its program
    image: str
    port: int
    fits: bool = True
    problem: str | None = None
    need_bytes: int | None = None
    have_bytes: int | None = None
    ways_out: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def engine(self) -> str:
        return self.inputs.engine

    @property
    def program(self) -> list[str]:
        """What starts the engine: `vllm serve` / `text-generation-launcher`, or the user's --launcher."""
        return list(self.inputs.launcher or (vllm_flags if self.engine == "vllm" else tgi_flags).PROGRAM)

    @property
    def argv(self) -> list[str]:
        return self.program + self.args

    @property
    def estimates(self) -> list[Term]:
        return [term for term in self.memory if term.is_estimate]

    def to_dict(self) -> dict[str, Any]:
        inputs = self.inputs
        gpu = inputs.gpu.to_dict() if inputs.gpu else None
        return {
            "engine": self.engine,
            "model": inputs.spec.name,
            "gpu": gpu,
            "gpus": inputs.gpus or inputs.tp,
            "tp": inputs.tp,
            "device": inputs.device,
            "fits": self.fits,
            "problem": self.problem,
            "need_bytes": self.need_bytes,
            "have_bytes": self.have_bytes,
            "flags": self.flags,
            "command": {"argv": self.argv, "program": self.program, "image": self.image, "port": self.port},
            "memory": {"kv_cache_bytes": self.kv_cache_bytes, "terms": [term.to_dict() for term in self.memory]},
            "capacity": self.capacity,
            "workload": inputs.workload.to_dict(),
            "estimates": [
                {"term": term.name, "bytes": term.bytes, "basis": term.formula, "measure": term.measure}
                for term in self.estimates
            ],
            "ways_out": self.ways_out,
            "warnings": self.warnings,
            "notes": self.notes,
        }


def plan(inputs: PlanInputs) -> Plan:
    """Plan one deployment; when it does not fit, also compute the ways out."""
    result = _plan_once(inputs)
    if not result.fits:
        result.ways_out = ways_out(inputs, result)
    return result


def predict(inputs: PlanInputs) -> Plan:
    """The plan alone, without searching for ways out (calibration and sweeps)."""
    return _plan_once(inputs)


def _plan_once(inputs: PlanInputs) -> Plan:
    if inputs.engine not in ENGINES:
        raise UsageError(f"--engine {inputs.engine!r}; valid: {', '.join(ENGINES)}")
    gpus = inputs.gpus or inputs.tp
    if gpus % inputs.tp:
        raise UsageError(f"--gpus {gpus} is not a multiple of --tp {inputs.tp}: each replica takes tp GPUs")
    if inputs.engine == "vllm":
        return _plan_vllm(inputs)
    return _plan_tgi(inputs)


# --- vLLM -----------------------------------------------------------------------------------------------


def _plan_vllm(inputs: PlanInputs) -> Plan:
    spec, device, tp = inputs.spec, inputs.device, inputs.tp
    if device not in vllm.DEVICES:
        raise UsageError(f"--device {device!r}; valid: {', '.join(vllm.DEVICES)}")
    dtype = resolve_kv_dtype(inputs.kv_dtype, spec.dtype)
    kv_flag = vllm_flags.kv_cache_dtype(dtype, spec.dtype, device)
    block_size = inputs.block_size or vllm.default_block_size(spec, device)
    layout = vllm.kv_layout(spec, dtype, tp, block_size)
    model_limit = _model_limit(spec)
    fixed_len = inputs.max_model_len if isinstance(inputs.max_model_len, int) else model_limit
    gpu = inputs.gpu
    defaults = vllm.batch_defaults(device, gpu.memory_bytes if gpu else None, gpu.name if gpu else "", tp)
    batched, default_seqs = vllm.resolve_batch(defaults, fixed_len, inputs.batched_tokens, inputs.max_num_seqs)
    in_flight = vllm.max_in_flight_tokens(batched, device)
    requested_seqs = inputs.concurrency * inputs.workload.sequences if isinstance(inputs.concurrency, int) else 0
    sampler_seqs = max(default_seqs, requested_seqs)

    memory, kv_bytes, warnings = _vllm_memory(inputs, batched, sampler_seqs)
    result = Plan(
        inputs,
        memory,
        kv_bytes,
        {},
        {},
        [],
        vllm_flags.ROCM_IMAGE if gpu and gpu.vendor == "amd" else vllm_flags.IMAGE,
        vllm_flags.PORT,
        warnings=warnings,
    )
    result.notes.append(
        f"KV cache layout: {layout.describe()}, {format_bytes(layout.bytes_per_block)} per block of {block_size} tokens ({layout.bytes_per_block} B)"
    )
    if layout.padding_layers:
        result.warnings.append(
            f"vLLM pads {layout.padding_layers} layer slot(s) to even out its KV cache groups: that share of each block holds nothing"
        )
    usable = max(0, layout.num_blocks(kv_bytes) - 1) if kv_bytes > 0 else 0

    target = inputs.concurrency if isinstance(inputs.concurrency, int) else 1
    if inputs.max_model_len == "auto":
        length = (
            min(model_limit, vllm.longest_context(layout, inputs.warn_level * usable, target, in_flight, model_limit))
            if usable
            else 0
        )
        result.notes.append(
            f"--max-model-len auto: the longest context at which {target} sequence(s) stay under the warn level ({inputs.warn_level:.0%} of {usable} usable blocks)"
        )
        if length == 0:
            return _does_not_fit(
                result,
                f"not even 1 token per sequence fits for {target} sequence(s) under the warn level",
                kv_bytes_needed=layout.bytes_per_block * (target + 1),
                have=kv_bytes,
            )
    else:
        length = fixed_len
    cap = vllm.capacity(layout, max(kv_bytes, 0), length, in_flight)
    tokens = _request_tokens(inputs.workload, length)
    prompt = inputs.workload.prompt_tokens if inputs.workload.prompt_tokens is not None else tokens
    per_request = layout.blocks_held(min(prompt, tokens), tokens, inputs.workload.sequences)
    under_warn = floor(inputs.warn_level * cap.usable_blocks / per_request) if per_request else 0
    at_full = cap.usable_blocks // per_request if per_request else 0

    seqs = _vllm_max_num_seqs(inputs, under_warn, defaults, result)
    result.capacity = {
        "num_blocks": cap.num_blocks,
        "usable_blocks": cap.usable_blocks,
        "block_size": block_size,
        "bytes_per_block": layout.bytes_per_block,
        "kv_cache_groups": len(layout.groups),
        "kv_tokens": cap.kv_cache_size_tokens,
        "kv_cache_size_tokens": cap.kv_cache_size_tokens,
        "max_model_len": length,
        "blocks_per_request_at_max_model_len": cap.blocks_per_request,
        "max_concurrency": round(cap.max_concurrency, 4),
        "tokens_per_request": tokens,
        "blocks_per_request": per_request,
        "requests_under_warn": under_warn,
        "requests_at_full": at_full,
        "warn_level": inputs.warn_level,
        "max_num_batched_tokens": batched,
        "max_in_flight_tokens": in_flight,
        "replicas": (inputs.gpus or tp) // tp,
    }
    result.flags = _vllm_flags(inputs, length, kv_bytes, seqs, batched, block_size, kv_flag)
    result.args = flag_args(result.flags)
    _vllm_warnings(inputs, layout, dtype, length, tokens, result)
    return _vllm_fit(inputs, result, layout, cap, per_request, under_warn)


def _vllm_memory(inputs: PlanInputs, batched: int, sampler_seqs: int) -> tuple[list[Term], int, list[str]]:
    """Every term of the per-GPU budget, and the KV bytes it leaves."""
    spec, gpu, profile, tp = inputs.spec, inputs.gpu, inputs.profile, inputs.tp
    warnings: list[str] = []
    if profile and profile.engine != "vllm":
        raise UsageError(
            f"--profile is a {profile.engine} profile; plan --engine {profile.engine} with it, or calibrate a vLLM run"
        )
    if profile:
        warnings += _profile_mismatch(inputs, batched)
    fmt = common.weight_format(spec, inputs.quantization)
    weights = common.weight_bytes(spec, fmt, tp)
    if profile and profile.weights_bytes is not None:
        measured, scaled = profile.weights_bytes, ""
        if profile.tp and profile.tp != tp:  # each rank holds 1/tp of the weights
            measured, scaled = ceil(profile.weights_bytes * profile.tp / tp), f", x {profile.tp}/{tp} for tp {tp}"
        weights = Term("weights", measured, "measured", f"profile {profile.source}: 'Model loading took'{scaled}", None)
    overheads = _vllm_overheads(inputs, batched, sampler_seqs)
    terms: list[Term] = []
    if inputs.kv_cache_memory_bytes is not None:
        kv = inputs.kv_cache_memory_bytes
        kv_term = Term(
            "kv_cache", kv, "input", "--kv-cache-memory-bytes: vLLM skips its memory profile and allocates exactly this"
        )
        if gpu is None:
            return [weights, kv_term], kv, warnings  # nothing to check the other terms against
        used = weights.bytes + sum(term.bytes for term in overheads) + kv
        terms = [
            Term(
                "total",
                _total(inputs),
                "measured" if profile and profile.total_memory_bytes else "input",
                _total_formula(inputs),
            ),
            weights,
            *overheads,
            kv_term,
            Term(
                "headroom",
                _total(inputs) - used,
                "computed",
                "total - weights - activation - non-torch - CUDA graphs - KV cache",
            ),
        ]
        return terms, kv, warnings
    if gpu is None:
        raise UsageError("missing --gpu NAME or --gpu-memory SIZE (or pin the KV cache with --kv-cache-memory-bytes)")
    utilization = inputs.memory_fraction or vllm.DEFAULT_GPU_MEMORY_UTILIZATION
    total = _total(inputs)
    requested = vllm.requested_memory(total, utilization)
    kv = requested - weights.bytes - sum(term.bytes for term in overheads)
    terms = [
        Term("total", total, "measured" if profile and profile.total_memory_bytes else "input", _total_formula(inputs)),
        Term("requested", requested, "computed", f"ceil({total} B x gpu_memory_utilization {utilization:g})"),
        weights,
        *overheads,
        Term(
            "kv_cache",
            kv,
            "computed",
            "requested - weights - activation - non-torch - CUDA graphs (vLLM's available KV cache memory)",
        ),
    ]
    return terms, kv, warnings


def _vllm_overheads(inputs: PlanInputs, batched: int, sampler_seqs: int) -> list[Term]:
    spec, profile, tp = inputs.spec, inputs.profile, inputs.tp
    graphs_off = inputs.enforce_eager or inputs.device == "cpu"
    if profile and profile.overhead_bytes is not None and profile.activation_bytes is None:
        return [
            Term(
                "overhead",
                profile.overhead_bytes,
                "measured",
                f"profile {profile.source}: requested - weights - available KV cache (activation peak + non-torch + CUDA graphs)",
            )
        ]
    forward = common.forward_activation_peak(spec, batched, tp)
    sampler = common.sampler_peak(spec, sampler_seqs)
    if profile and profile.activation_bytes is not None:
        activation = Term("activation", profile.activation_bytes, "measured", f"profile {profile.source}")
    else:
        which = (
            f"forward over {batched} batched tokens"
            if forward >= sampler
            else f"sampler logits for {sampler_seqs} sequences x {spec.vocab_size} vocab x {common.SAMPLER_BYTES_PER_LOGIT} B"
        )
        activation = Term(
            "activation",
            max(forward, sampler),
            "estimate",
            f"profile-run peak, max(forward {forward} B, sampler {sampler} B): {which}",
            common.CALIBRATE_HINT,
        )
    if profile and profile.non_torch_bytes is not None:
        non_torch = Term("non_torch", profile.non_torch_bytes, "measured", f"profile {profile.source}")
    else:
        non_torch = Term(
            "non_torch",
            common.non_torch_estimate(tp),
            "estimate",
            f"CUDA/cuBLAS workspaces, attention buffers{', NCCL and custom all-reduce (tp >= 2)' if tp > 1 else ''}",
            common.CALIBRATE_HINT,
        )
    if graphs_off:
        graphs = Term(
            "cuda_graphs",
            0,
            "exact",
            "--enforce-eager" if inputs.enforce_eager else "the CPU build captures no CUDA graphs",
        )
    elif profile and profile.cudagraph_bytes is not None:
        graphs = Term(
            "cuda_graphs",
            profile.cudagraph_bytes,
            "measured",
            f"profile {profile.source}: 'Estimated CUDA graph memory'",
        )
    else:
        graphs = Term(
            "cuda_graphs",
            common.CUDA_GRAPH_ESTIMATE,
            "estimate",
            "decode CUDA graphs, profiled by vLLM >= 0.21 before sizing KV (0 with --enforce-eager)",
            common.CALIBRATE_HINT,
        )
    return [activation, non_torch, graphs]


def _total(inputs: PlanInputs) -> int:
    if inputs.profile and inputs.profile.total_memory_bytes:
        return inputs.profile.total_memory_bytes
    return inputs.gpu.memory_bytes


def _total_formula(inputs: PlanInputs) -> str:
    if inputs.profile and inputs.profile.total_memory_bytes:
        return f"device total the engine measured (profile {inputs.profile.source})"
    gpu = inputs.gpu
    return f"{gpu.id}: {gpu.memory_mib:g} MiB as {gpu.reported_by} reports it ({gpu.source})"


def _profile_mismatch(inputs: PlanInputs, batched: int) -> list[str]:
    profile, spec = inputs.profile, inputs.spec
    out = []
    if (
        profile.model
        and profile.model not in (spec.name, spec.source_path)
        and profile.model.rstrip("/").split("/")[-1] != spec.name.rstrip("/").split("/")[-1]
    ):
        out.append(
            f"--profile was measured on model {profile.model}, not {spec.name}: its weights and overheads may not apply"
        )
    if profile.tp and profile.tp != inputs.tp:
        out.append(f"--profile was measured at tp {profile.tp}, the plan is for tp {inputs.tp}")
    if profile.max_num_batched_tokens and profile.max_num_batched_tokens != batched:
        out.append(
            f"--profile was measured with max_num_batched_tokens {profile.max_num_batched_tokens}, the plan uses {batched}: the activation peak scales with it"
        )
    return out


def _model_limit(spec: ModelSpec) -> int:
    if spec.max_position_embeddings:
        return spec.max_position_embeddings
    raise UsageError(f"{spec.name} has no max_position_embeddings: give --max-model-len N")


def _request_tokens(workload: Workload, length: int) -> int:
    total = workload.total_tokens
    return length if total is None else min(total, length)


def _vllm_max_num_seqs(inputs: PlanInputs, under_warn: int, defaults: vllm.BatchDefaults, result: Plan) -> int:
    seqs_per_request = inputs.workload.sequences
    if inputs.max_num_seqs is not None:
        if inputs.max_num_seqs > under_warn * seqs_per_request:
            result.warnings.append(
                f"--max-num-seqs {inputs.max_num_seqs} lets more sequences run than stay under the warn level ({under_warn * seqs_per_request}): expect KV pressure and preemptions"
            )
        return inputs.max_num_seqs
    if under_warn < 1:
        result.warnings.append(
            f"not one request of the expected size stays under the warn level ({inputs.warn_level:.0%}): the watcher will degrade the service from the first long request"
        )
    wanted = max(1, under_warn) * seqs_per_request
    if isinstance(inputs.concurrency, int):
        wanted = max(min(wanted, defaults.max_num_seqs), inputs.concurrency * seqs_per_request)
    elif wanted > defaults.max_num_seqs:
        result.notes.append(
            f"max-num-seqs capped at vLLM's default for this device ({defaults.max_num_seqs}; {defaults.rule}); {wanted} sequences would stay under the warn level"
        )
        wanted = defaults.max_num_seqs
    return wanted


def _vllm_flags(
    inputs: PlanInputs, length: int, kv_bytes: int, seqs: int, batched: int, block_size: int, kv_flag: str
) -> dict[str, Any]:
    replicas = (inputs.gpus or inputs.tp) // inputs.tp
    pinned = inputs.kv_cache_memory_bytes is not None
    flags: dict[str, Any] = {
        "model": model_argument(inputs.spec),
        "tensor-parallel-size": inputs.tp,
        "data-parallel-size": replicas if replicas > 1 else None,
        "max-model-len": length,
        "gpu-memory-utilization": None
        if pinned and inputs.device == "cpu"
        else (inputs.memory_fraction or vllm.DEFAULT_GPU_MEMORY_UTILIZATION),
        "kv-cache-memory-bytes": kv_bytes if pinned else None,
        "max-num-seqs": seqs,
        "max-num-batched-tokens": batched,
        "block-size": block_size,
        "kv-cache-dtype": kv_flag,
        "enforce-eager": True if inputs.enforce_eager else None,
        "scheduler-cls": vllm_flags.GUARD_SCHEDULER if inputs.guard is not False else None,
        "max-num-queued-reqs": inputs.max_queued,
    }
    return {name: value for name, value in flags.items() if value is not None}


def model_argument(spec: ModelSpec) -> str:
    """What the engine loads: the HF id, or for a local config.json the folder holding it."""
    if spec.source != "path":
        return spec.name
    return spec.name[: -len("config.json")].rstrip("/") or "." if spec.name.endswith("config.json") else spec.name


def _vllm_warnings(
    inputs: PlanInputs, layout: vllm.KVCacheLayout, dtype: KvDtype, length: int, tokens: int, result: Plan
) -> None:
    spec = inputs.spec
    if spec.max_position_embeddings and length > spec.max_position_embeddings:
        result.warnings.append(
            f"--max-model-len {length} exceeds {spec.name}'s max_position_embeddings {spec.max_position_embeddings}; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    total = inputs.workload.total_tokens
    if total is not None and total > length:
        result.warnings.append(
            f"requests of {total} tokens (prompt + gen) exceed --max-model-len {length}: vLLM rejects them"
        )
    if any(group.kind == "sliding" for group in layout.groups):
        windows = sorted({group.window for group in layout.groups if group.kind == "sliding"})
        result.notes.append(
            f"sliding-window layers (window {', '.join(map(str, windows))}) hold about window + {result.capacity['max_in_flight_tokens']} tokens in flight per request, not the whole context"
        )
    if dtype.is_quantized and dtype.scales == "per_token_head":
        result.warnings.append(f"--kv-dtype {dtype.name}: {QUALITY_WARNING}")
    if spec.num_kv_heads < inputs.tp and not spec.is_mla:
        result.notes.append(
            f"tp {inputs.tp} > {spec.num_kv_heads} KV heads: each KV head is replicated on {inputs.tp // spec.num_kv_heads} ranks, per-GPU KV does not shrink further"
        )
    if inputs.workload.sequences > 1:
        result.notes.append(
            f"{inputs.workload.sequences} sequences per request (n x beams): vLLM runs each as its own request; with prefix caching the prompt's full blocks are shared"
        )
    _estimates_warning(result)


def _estimates_warning(result: Plan) -> None:
    estimates = result.estimates
    if estimates:
        items = ", ".join(f"{term.name} {format_bytes(term.bytes)}" for term in estimates)
        result.warnings.append(f"estimates in this plan: {items}; {estimates[0].measure}")


def _vllm_fit(
    inputs: PlanInputs, result: Plan, layout: vllm.KVCacheLayout, cap: vllm.Capacity, per_request: int, under_warn: int
) -> Plan:
    kv = result.kv_cache_bytes
    if kv <= 0:
        others = sum(
            term.bytes
            for term in result.memory
            if term.name in ("weights", "activation", "non_torch", "cuda_graphs", "overhead")
        )
        have = next(term.bytes for term in result.memory if term.name == "requested")
        return _does_not_fit(
            result,
            f"weights and overheads need {format_bytes(others)} per GPU but vLLM may use {format_bytes(have)} ({inputs.memory_fraction or vllm.DEFAULT_GPU_MEMORY_UTILIZATION:g} of {format_bytes(_total(inputs))}); nothing is left for the KV cache",
            others + layout.bytes_per_block * (cap.blocks_per_request + 1),
            have,
        )
    headroom = next((term for term in result.memory if term.name == "headroom"), None)
    if headroom is not None and headroom.bytes < 0:
        need = _total(inputs) - headroom.bytes
        return _does_not_fit(
            result,
            f"weights, overheads and the pinned {format_bytes(kv)} KV cache need {format_bytes(need)} per GPU; the device has {format_bytes(_total(inputs))}",
            need,
            _total(inputs),
        )
    if not cap.fits_one_request:
        need = vllm.kv_bytes_needed(layout, cap.blocks_per_request)
        return _does_not_fit(
            result,
            f"one request at --max-model-len {cap.max_model_len} needs {cap.blocks_per_request} blocks = {format_bytes(need)} of KV cache; {format_bytes(kv)} holds {cap.usable_blocks} usable blocks (vLLM would refuse to start: 'To serve at least one request with the model's max seq len')",
            need,
            kv,
        )
    if isinstance(inputs.concurrency, int) and inputs.concurrency > under_warn:
        blocks = ceil(inputs.concurrency * per_request / inputs.warn_level)
        need = vllm.kv_bytes_needed(layout, blocks)
        return _does_not_fit(
            result,
            f"{inputs.concurrency} concurrent requests of {result.capacity['tokens_per_request']} tokens need {inputs.concurrency * per_request} blocks, {blocks} with the {inputs.warn_level:.0%} warn level = {format_bytes(need)} of KV cache; the plan has {format_bytes(kv)} ({cap.usable_blocks} usable blocks: {under_warn} requests under the warn level)",
            need,
            kv,
        )
    if inputs.concurrency == "auto" and under_warn < 1:
        need = vllm.kv_bytes_needed(layout, ceil(per_request / inputs.warn_level))
        return _does_not_fit(
            result,
            f"not one request of {result.capacity['tokens_per_request']} tokens stays under the warn level ({per_request} blocks of {cap.usable_blocks})",
            need,
            kv,
        )
    return result


def _does_not_fit(result: Plan, problem: str, kv_bytes_needed: int, have: int) -> Plan:
    result.fits = False
    result.problem = problem
    result.need_bytes = kv_bytes_needed
    result.have_bytes = have
    return result


# --- TGI ------------------------------------------------------------------------------------------------


def _plan_tgi(inputs: PlanInputs) -> Plan:
    spec, tp, gpu = inputs.spec, inputs.tp, inputs.gpu
    if inputs.device != "gpu":
        raise UsageError("--device cpu is for vLLM's CPU build; TGI plans are for GPUs")
    for name, value in (
        ("--kv-cache-memory-bytes", inputs.kv_cache_memory_bytes),
        ("--block-size", inputs.block_size),
        ("--max-queued", inputs.max_queued),
    ):
        if value is not None:
            raise UsageError(f"{name} is a vLLM option; TGI sizes its KV pool itself (use --cuda-memory-fraction)")
    if inputs.guard:
        raise UsageError("--guard adds vLLM's KV-guard scheduler; TGI has no scheduler plugin (use the kvops proxy)")
    if gpu is None:
        raise UsageError("missing --gpu NAME or --gpu-memory SIZE")
    if (inputs.gpus or tp) != tp:
        raise UsageError(
            f"TGI runs one replica per launcher over --num-shard GPUs: give --gpus {tp} (= --tp) and start {(inputs.gpus or tp) // tp} launchers"
        )
    dtype = resolve_kv_dtype(inputs.kv_dtype, spec.dtype)
    kv_flag = tgi.tgi_kv_dtype(dtype, spec.dtype)
    attention = tgi.resolve_attention(spec, gpu.vendor)
    tgi.check_fp8(attention, kv_flag, gpu.vendor)
    per_token = tgi.kv_bytes_per_token(spec, dtype, tp)
    model_limit = _model_limit(spec)
    prefill = inputs.batched_tokens or min(_tgi_default_prefill(spec), model_limit)
    chunking = attention.supports_chunking
    if not chunking and inputs.batched_tokens is None:
        # Without prefill chunking a whole prompt must fit one prefill batch: size the warmup for the longest prompt.
        given = inputs.max_input_tokens or (inputs.max_model_len - 1 if isinstance(inputs.max_model_len, int) else None)
        prefill = max(prefill, given or 0)

    memory, kv_bytes, warnings = _tgi_memory(inputs, prefill)
    cap = tgi.tgi_capacity(kv_bytes, per_token, attention.block_size)
    result = Plan(
        inputs,
        memory,
        kv_bytes,
        {},
        {},
        [],
        tgi_flags.ROCM_IMAGE if gpu.vendor == "amd" else tgi_flags.IMAGE,
        tgi_flags.PORT,
        warnings=warnings,
    )
    result.notes.append(
        f"attention {attention.backend} (block size {attention.block_size}): {attention.reason}; prefill chunking {'on' if chunking else 'off'}"
    )
    sequences = inputs.workload.sequences
    target = inputs.concurrency if isinstance(inputs.concurrency, int) else 1

    if inputs.max_model_len == "auto":
        length = _tgi_longest(cap, inputs.warn_level, target * sequences, model_limit)
        result.notes.append(
            f"--max-model-len auto: the longest max-total-tokens at which {target} request(s) stay under the warn level ({inputs.warn_level:.0%} of {cap.usable_blocks} usable blocks)"
        )
    elif isinstance(inputs.max_model_len, int):
        length = inputs.max_model_len
    else:
        length = min(model_limit, cap.max_batch_total_tokens) if cap.max_batch_total_tokens > 1 else model_limit
    if (
        not chunking
        and not isinstance(inputs.max_model_len, int)
        and inputs.max_input_tokens is None
        and length > prefill + 1
    ):
        length = prefill + 1
        result.notes.append(
            f"prefill chunking is off: max-total-tokens held to --max-batch-prefill-tokens + 1 ({length}); raise --max-batch-prefill-tokens for longer prompts (it costs warmup memory)"
        )
    max_input = inputs.max_input_tokens if inputs.max_input_tokens is not None else max(1, length - 1)
    reservation = _tgi_reservation(inputs.workload, max_input, length)
    blocks_per_request = sequences * -(-reservation // attention.block_size)
    under_warn = floor(inputs.warn_level * cap.usable_blocks / blocks_per_request) if blocks_per_request else 0
    at_full = cap.usable_blocks // blocks_per_request if blocks_per_request else 0
    concurrent = inputs.max_num_seqs if inputs.max_num_seqs is not None else max(1, at_full, target) * sequences
    result.capacity = {
        "num_blocks": cap.num_blocks,
        "usable_blocks": cap.usable_blocks,
        "block_size": attention.block_size,
        "kv_bytes_per_token": per_token,
        "max_batch_total_tokens": cap.max_batch_total_tokens,
        "kv_tokens": cap.max_batch_total_tokens,
        "num_blocks_note": "TGI's max batch total tokens = num_blocks x block size; block 0 is kept for health checks",
        "max_model_len": length,
        "max_concurrency": round(cap.usable_blocks / -(-length // attention.block_size), 4) if length else 0,
        "reservation_tokens_per_request": reservation,
        "blocks_per_request": blocks_per_request,
        "requests_under_warn": under_warn,
        "requests_at_full": at_full,
        "warn_level": inputs.warn_level,
        "max_batch_prefill_tokens": prefill,
        "attention": attention.backend,
        "prefill_chunking": attention.supports_chunking,
    }
    result.flags = {
        "model-id": model_argument(spec),
        "num-shard": tp,
        "max-input-tokens": max_input,
        "max-total-tokens": length,
        "max-batch-prefill-tokens": prefill,
        "max-concurrent-requests": concurrent,
        "cuda-memory-fraction": inputs.memory_fraction or tgi.DEFAULT_CUDA_MEMORY_FRACTION,
    }
    if kv_flag:
        result.flags["kv-cache-dtype"] = kv_flag
    result.args = flag_args(result.flags)
    _tgi_warnings(inputs, attention, result)
    return _tgi_fit(
        inputs, result, cap, max_input, length, prefill, attention, blocks_per_request, under_warn, per_token
    )


def _tgi_default_prefill(spec: ModelSpec) -> int:
    """The launcher's fallback when its FLOPs table does not apply (`main.rs`: gemma3 8000, qwen2-vl 10000)."""
    return {"gemma3": 8000, "gemma3_text": 8000, "qwen2_vl": 10000, "qwen2_5_vl": 10000}.get(
        spec.model_type, tgi.DEFAULT_MAX_BATCH_PREFILL_TOKENS
    )


def _tgi_reservation(workload: Workload, max_input: int, length: int) -> int:
    if workload.total_tokens is None:
        return max(1, length - 1)  # the worst request: max input plus one new token, or short input plus many
    return max(1, tgi.reservation_tokens(workload.prompt_tokens or 0, workload.gen_tokens or 0))


def _tgi_longest(cap: tgi.TgiCapacity, warn: float, sequences: int, upper: int) -> int:
    blocks = floor(warn * cap.usable_blocks / sequences)
    return min(upper, blocks * cap.block_size + 1) if blocks else 0


def _tgi_memory(inputs: PlanInputs, prefill: int) -> tuple[list[Term], int, list[str]]:
    spec, tp, profile = inputs.spec, inputs.tp, inputs.profile
    if profile and profile.engine != "tgi":
        raise UsageError(
            f"--profile is a {profile.engine} profile; plan --engine {profile.engine} with it, or calibrate a TGI run"
        )
    fraction = inputs.memory_fraction or tgi.DEFAULT_CUDA_MEMORY_FRACTION
    total = _total(inputs)
    budget = floor(total * fraction * tgi.TGI_WIGGLE_ROOM)
    weights = common.weight_bytes(spec, common.weight_format(spec, inputs.quantization), tp)
    terms = [
        Term("total", total, "measured" if profile and profile.total_memory_bytes else "input", _total_formula(inputs)),
        Term(
            "budget",
            budget,
            "computed",
            f"total x cuda_memory_fraction {fraction:g} x TGI_WIGGLE_ROOM {tgi.TGI_WIGGLE_ROOM:g} (get_cuda_free_memory)",
        ),
        weights,
    ]
    if profile and profile.overhead_bytes is not None:
        terms.append(
            Term(
                "overhead", profile.overhead_bytes, "measured", f"profile {profile.source}: budget - weights - KV pool"
            )
        )
    else:
        forward = common.forward_activation_peak(spec, prefill, tp)
        logits = (
            prefill * spec.vocab_size * (2 + 2)
        )  # the warmup batch asks for prefill logprobs: every prefill token's logits and their log_softmax, 16-bit
        terms.append(
            Term(
                "activation",
                forward + logits,
                "estimate",
                f"warmup prefill of {prefill} tokens: forward {forward} B + prefill logits {logits} B (kept in PyTorch's cache when TGI measures free memory)",
                common.CALIBRATE_HINT.replace("--vllm-log", "--tgi-log"),
            )
        )
        terms.append(
            Term(
                "non_torch",
                common.non_torch_estimate(tp),
                "estimate",
                "CUDA context, cuBLAS and NCCL buffers (TGI measures device-wide free memory)",
                common.CALIBRATE_HINT.replace("--vllm-log", "--tgi-log"),
            )
        )
    kv = budget - sum(term.bytes for term in terms[2:])
    terms.append(
        Term(
            "kv_cache",
            kv,
            "computed",
            "budget - weights - activation - non-torch: TGI's KV pool, allocated whole at warmup",
        )
    )
    return terms, kv, []


def _tgi_warnings(inputs: PlanInputs, attention: tgi.Attention, result: Plan) -> None:
    spec = inputs.spec
    if spec.sliding_window:
        result.notes.append(
            f"{spec.name} has sliding-window layers (window {spec.sliding_window}): TGI still reserves and caches the full context for every request (Model.info window_size None)"
        )
    if inputs.workload.sequences > 1:
        result.notes.append(
            f"{inputs.workload.sequences} sequences per request: TGI's best_of runs each as an independent request with its own full reservation and concurrency permit"
        )
    result.notes.append(
        f"each request reserves input + min(max_new_tokens, {tgi.DEFAULT_GENERATION_LENGTH}) tokens up front; TGI never preempts, requests wait in the queue"
    )
    result.notes.append(
        f'--max-batch-total-tokens is not emitted: TGI ignores it on flash models ("{tgi_flags.MAX_BATCH_TOTAL_TOKENS_IGNORED}") and sizes the pool from free memory'
    )
    graphs = common.CUDA_GRAPH_ESTIMATE
    spare = floor(_total(inputs) * (inputs.memory_fraction or 1.0)) - floor(
        _total(inputs) * (inputs.memory_fraction or 1.0) * tgi.TGI_WIGGLE_ROOM
    )
    if graphs > spare:
        result.warnings.append(
            f"CUDA graphs (~{format_bytes(graphs)}, captured after the KV pool) may not fit in the {format_bytes(spare)} TGI_WIGGLE_ROOM leaves: consider --cuda-graphs 0"
        )
    _estimates_warning(result)


def _tgi_fit(
    inputs: PlanInputs,
    result: Plan,
    cap: tgi.TgiCapacity,
    max_input: int,
    length: int,
    prefill: int,
    attention: tgi.Attention,
    blocks_per_request: int,
    under_warn: int,
    per_token: int,
) -> Plan:
    block_bytes = per_token * attention.block_size
    if result.kv_cache_bytes <= 0 or length == 0:
        others = sum(
            term.bytes for term in result.memory if term.name in ("weights", "activation", "non_torch", "overhead")
        )
        budget = next(term.bytes for term in result.memory if term.name == "budget")
        return _does_not_fit(
            result,
            f"weights and warmup need {format_bytes(others)} per shard but TGI may use {format_bytes(budget)}; nothing is left for the KV cache",
            others + block_bytes * 2,
            budget,
        )
    errors = tgi_flags.validation_errors(
        max_input, length, prefill, cap.max_batch_total_tokens, attention.supports_chunking
    )
    if errors:
        need = -(-length // attention.block_size) * block_bytes
        return _does_not_fit(
            result,
            f"TGI would refuse to start: {errors[0]} (the KV pool holds {cap.max_batch_total_tokens} tokens = {format_bytes(result.kv_cache_bytes)})",
            max(need, prefill * per_token),
            result.kv_cache_bytes,
        )
    if isinstance(inputs.concurrency, int) and inputs.concurrency > under_warn:
        blocks = ceil(inputs.concurrency * blocks_per_request / inputs.warn_level) + 1
        need = blocks * block_bytes
        return _does_not_fit(
            result,
            f"{inputs.concurrency} concurrent requests reserving {result.capacity['reservation_tokens_per_request']} tokens each need {format_bytes(need)} of KV cache with the {inputs.warn_level:.0%} warn level; the plan has {format_bytes(result.kv_cache_bytes)} ({under_warn} requests under the warn level)",
            need,
            result.kv_cache_bytes,
        )
    if inputs.concurrency == "auto" and under_warn < 1:
        return _does_not_fit(
            result,
            f"not one request reserving {result.capacity['reservation_tokens_per_request']} tokens stays under the warn level",
            ceil(blocks_per_request / inputs.warn_level + 1) * block_bytes,
            result.kv_cache_bytes,
        )
    return result


# --- ways out -------------------------------------------------------------------------------------------


def ways_out(inputs: PlanInputs, failed: Plan) -> list[dict[str, Any]]:
    """Re-plan with each change a user can make; report what each one gives."""
    options: list[dict[str, Any]] = []
    dtype = resolve_kv_dtype(inputs.kv_dtype, inputs.spec.dtype)
    if dtype.bits >= 16:
        quantized = ["fp8"] if inputs.engine == "tgi" or inputs.device == "cpu" else ["fp8", "int8", "int4"]
        for name in quantized:
            options.append(_try(inputs, f"--kv-dtype {name}", replace(inputs, kv_dtype=name), QUALITY_WARNING))
    if not isinstance(inputs.max_model_len, str) and not isinstance(inputs.concurrency, str):
        options.append(_try(inputs, "--max-model-len auto", replace(inputs, max_model_len="auto"), None))
    if isinstance(inputs.concurrency, int):
        options.append(_try(inputs, "--concurrency auto", replace(inputs, concurrency="auto"), None))
    for tp in (2, 4, 8):
        if tp <= inputs.tp:
            continue
        try:
            check_tp(inputs.spec, tp)
        except KvopsError:
            continue
        change = replace(inputs, tp=tp, gpus=tp * ((inputs.gpus or inputs.tp) // inputs.tp))
        option = _try(inputs, f"--tp {tp}", change, None)
        options.append(option)
        if option["fits"]:
            break
    replicas = _replicas_option(inputs, failed)
    if replicas:
        options.append(replicas)
    if inputs.gpu is not None and inputs.device == "gpu":
        bigger = sorted(
            (gpu for gpu in gpu_catalog() if gpu.memory_bytes > inputs.gpu.memory_bytes),
            key=lambda gpu: gpu.memory_bytes,
        )
        for gpu in bigger:
            option = _try(inputs, f"--gpu {gpu.id}", replace(inputs, gpu=gpu, profile=None), None)
            if option["fits"]:
                options.append(option)
                break
    options += _offload_options(inputs, failed)
    return options


def _replicas_option(inputs: PlanInputs, failed: Plan) -> dict[str, Any] | None:
    """More vLLM data-parallel replicas: the same engine on more GPUs, the concurrency split between them."""
    per_replica = failed.capacity.get("requests_under_warn", 0)
    if (
        inputs.engine != "vllm"
        or not isinstance(inputs.concurrency, int)
        or per_replica < 1
        or inputs.concurrency <= per_replica
    ):
        return None
    factor = ceil(inputs.concurrency / per_replica)
    gpus = (inputs.gpus or inputs.tp) * factor
    share = ceil(inputs.concurrency / factor)
    option = _try(inputs, f"--gpus {gpus}", replace(inputs, gpus=gpus, concurrency=share), None)
    if option["fits"]:
        option["result"] = (
            f"fits: {gpus // inputs.tp} replicas of tp {inputs.tp}, {share} of the {inputs.concurrency} requests each ({per_replica} fit one replica under the warn level)"
        )
    return option | {"replicas": gpus // inputs.tp, "concurrency_per_replica": share}


def _try(inputs: PlanInputs, change: str, changed: PlanInputs, warning: str | None) -> dict[str, Any]:
    try:
        result = _plan_once(changed)
    except KvopsError as exc:
        return {"change": change, "fits": False, "result": str(exc), "warning": warning}
    cap = result.capacity
    if result.fits:
        summary = f"fits: {cap.get('kv_tokens', 0):,} KV tokens, {cap.get('requests_under_warn', 0)} requests of {cap.get('tokens_per_request', cap.get('reservation_tokens_per_request'))} tokens under the warn level, max-model-len {cap.get('max_model_len')}"
    else:
        summary = f"still does not fit: {result.problem}"
    return {
        "change": change,
        "fits": result.fits,
        "result": summary,
        "warning": warning,
        "flags": result.flags if result.fits else None,
    }


def _offload_options(inputs: PlanInputs, failed: Plan) -> list[dict[str, Any]]:
    if inputs.engine != "vllm" or inputs.device != "gpu" or failed.need_bytes is None or failed.have_bytes is None:
        return []
    short = max(0, failed.need_bytes - max(failed.have_bytes, 0))
    if short <= 0:
        return []
    gib = ceil(short / (1 << 30))
    seconds = gib * (1 << 30) / PCIE_BYTES_PER_SECOND
    weights = next((term.bytes for term in failed.memory if term.name == "weights"), 0)
    options = []
    if gib * (1 << 30) < weights:
        options.append(
            {
                "change": f"--cpu-offload-gb {gib}",
                "fits": None,
                "result": f"moves {gib} GiB of weights per GPU to host memory (UVA), freeing it for KV; every forward step streams them over PCIe: ~{seconds * 1000:.0f} ms per step at ~25 GB/s (an estimate)",
                "warning": "decode slows by that much on every token",
            }
        )
    options.append(
        {
            "change": f"--kv-offloading-size {gib * inputs.tp} --kv-offloading-backend native",
            "fits": None,
            "result": f"keeps {gib * inputs.tp} GiB (all TP ranks) of evicted KV blocks in host memory, so preempted and repeated prefixes reload over PCIe (~{seconds * 1000:.0f} ms per {gib} GiB) instead of being recomputed; it does not raise how many sequences run at once",
            "warning": f"costs {gib * inputs.tp} GiB of host RAM",
        }
    )
    return options
