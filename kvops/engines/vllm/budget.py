"""vLLM V1 (0.32.0): the memory budget the engine sizes its KV cache from, and its batching defaults.

`gpu_worker.determine_available_memory` takes `ceil(total x gpu_memory_utilization)` and subtracts everything else
it measured: the weights, the activation peak of a profile forward over `max_num_batched_tokens` tokens plus the
sampler's logits for `max_num_seqs` sequences, non-torch memory and the CUDA-graph estimate;
`--kv-cache-memory-bytes` replaces all of that with a fixed figure. How the KV bytes become blocks is layout.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from kvops.engines import common
from kvops.errors import MissingDevice, UsageError
from kvops.model.checkpoint import Parallel
from kvops.model.spec import ModelSpec
from kvops.plan import PlanInputs, Term
from kvops.units import format_bytes

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py CacheConfig.gpu_memory_utilization
GiB = 1 << 30

DEVICES = ("gpu", "cpu")


@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    rule: str


def batch_defaults(device: str, memory_bytes: int | None, gpu_name: str, world_size: int = 1) -> BatchDefaults:
    """`EngineArgs.get_batch_defaults` for the OpenAI API server (`vllm serve`)."""
    if device == "cpu":
        return BatchDefaults(
            2048 * world_size, 128 * world_size, "CPU: 2048 x world size tokens, 128 x world size sequences"
        )
    memory = memory_bytes or 0
    if memory >= 160 * GiB:
        return BatchDefaults(16384, 1024, "GPU >= 160 GiB: 16384 tokens, 1024 sequences")
    if memory >= 70 * GiB and "a100" not in gpu_name.lower():
        return BatchDefaults(8192, 1024, "GPU >= 70 GiB (not A100): 8192 tokens, 1024 sequences")
    return BatchDefaults(2048, 256, "other GPUs: 2048 tokens, 256 sequences")


def resolve_batch(
    defaults: BatchDefaults, max_model_len: int, max_num_batched_tokens: int | None, max_num_seqs: int | None
) -> tuple[int, int]:
    """What `_set_default_max_num_seqs_and_batched_tokens_args` settles on (chunked prefill on, the default)."""
    seqs = max_num_seqs if max_num_seqs is not None else defaults.max_num_seqs
    tokens = max_num_batched_tokens
    if tokens is None:
        tokens = min(seqs * max_model_len, defaults.max_num_batched_tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return tokens, seqs


def max_in_flight_tokens(max_num_batched_tokens: int, device: str) -> int:
    """`VllmConfig.max_in_flight_tokens`: two batches in flight with async scheduling (GPU default); one on CPU."""
    return (1 if device == "cpu" else 2) * max_num_batched_tokens


def requested_memory(total_bytes: int, utilization: float) -> int:
    """`request_memory`: ceil(total x gpu_memory_utilization)."""
    return ceil(total_bytes * utilization)


# --- the memory terms -----------------------------------------------------------------------------------


def memory_terms(
    inputs: PlanInputs, batched: int, sampler_seqs: int, stage: int | None = None
) -> tuple[list[Term], int, list[str]]:
    """Every term of the per-GPU budget, the KV bytes it leaves, and warnings about a profile that may not apply;
    with pipeline parallelism, of one stage (None: the stage holding the most weights)."""
    gpu, profile = inputs.gpu, inputs.profile
    warnings: list[str] = []
    if profile and profile.engine != "vllm":
        raise UsageError(
            f"--profile is a {profile.engine} profile; plan --engine {profile.engine} with it, or calibrate a vLLM run"
        )
    if profile:
        warnings += _profile_mismatch(inputs, batched)
    weights = _weights(inputs, stage)
    overheads = _overheads(inputs, batched, sampler_seqs)
    if inputs.kv_cache_memory_bytes is not None:
        kv = inputs.kv_cache_memory_bytes
        kv_term = Term(
            "kv_cache", kv, "input", "--kv-cache-memory-bytes: vLLM skips its memory profile and allocates exactly this"
        )
        if gpu is None:
            return [weights, kv_term], kv, warnings  # nothing to check the other terms against
        total = common.device_total_term(inputs)
        used = weights.bytes + sum(term.bytes for term in overheads) + kv
        headroom = Term(
            "headroom",
            total.bytes - used,
            "computed",
            "total - weights - activation - non-torch - CUDA graphs - KV cache",
        )
        return [total, weights, *overheads, kv_term, headroom], kv, warnings
    if gpu is None:
        raise MissingDevice(
            "missing --gpu NAME or --gpu-memory SIZE (or pin the KV cache with --kv-cache-memory-bytes)"
        )
    utilization = inputs.memory_fraction or DEFAULT_GPU_MEMORY_UTILIZATION
    total = common.device_total_term(inputs)
    requested = requested_memory(total.bytes, utilization)
    kv = requested - weights.bytes - sum(term.bytes for term in overheads)
    return (
        [
            total,
            Term("requested", requested, "computed", f"ceil({total.bytes} B x gpu_memory_utilization {utilization:g})"),
            weights,
            *overheads,
            Term(
                "kv_cache",
                kv,
                "computed",
                "requested - weights - activation - non-torch - CUDA graphs (vLLM's available KV cache memory)",
            ),
        ],
        kv,
        warnings,
    )


def weight_options(inputs: PlanInputs) -> common.WeightOptions:
    """How vLLM splits and loads the weights: routed experts over tp x dp ranks (`FusedMoEParallelConfig.make`
    flattens data parallelism into the experts' split, whole experts per rank with --enable-expert-parallel)."""
    parallel = Parallel(inputs.tp, inputs.pp, inputs.tp * inputs.replicas, inputs.expert_parallel)
    speculative = inputs.speculative
    return common.WeightOptions(
        parallel,
        serving_dtype=None if inputs.dtype == "auto" else inputs.dtype,
        text_only=inputs.text_only,
        load_mtp=speculative is not None and speculative.method == "mtp",
    )


def _weights(inputs: PlanInputs, stage: int | None = None) -> Term:
    """The weights per GPU: a profile's measured figure (rescaled to this tp), else the checkpoint's computed size;
    a draft model or EAGLE head on the last stage; --cpu-offload-gb subtracted."""
    profile, tp = inputs.profile, inputs.tp
    computed = _computed_weights(inputs, stage)
    if profile is None or profile.weights_bytes is None:
        return computed
    measured, scaled = profile.weights_bytes, ""
    if profile.tp and profile.tp != tp:  # each rank holds 1/tp of the weights
        measured, scaled = ceil(profile.weights_bytes * profile.tp / tp), f", x {profile.tp}/{tp} for tp {tp}"
    return Term("weights", measured, "measured", f"profile {profile.source}: 'Model loading took'{scaled}", None)


def _computed_weights(inputs: PlanInputs, stage: int | None) -> Term:
    term, stages = common.stage_weights(
        inputs.spec, common.weight_format(inputs.spec, inputs.quantization), weight_options(inputs)
    )
    index = stages.index(max(stages)) if stage is None else stage
    size, formula = stages[index], term.formula
    if inputs.pp > 1:
        formula = f"{formula}; stage {index} of {inputs.pp}"
    draft, words = _draft_weights(inputs)
    if draft and index == inputs.pp - 1:
        size, formula = size + draft, f"{formula}; + {words}"
    if inputs.cpu_offload_bytes:
        offloaded = min(size, inputs.cpu_offload_bytes)
        size, formula = size - offloaded, f"{formula}; - {format_bytes(offloaded)} in host memory (--cpu-offload-gb)"
    return replace(term, bytes=size, formula=formula)


def _draft_weights(inputs: PlanInputs) -> tuple[int, str]:
    """An EAGLE head's or a draft model's weights per GPU (MTP layers are the target's own, counted with it)."""
    speculative = inputs.speculative
    if speculative is None or speculative.draft is None:
        return 0, ""
    draft = speculative.draft
    tp = speculative.draft_tp or inputs.tp
    term = common.weight_bytes(draft, common.weight_format(draft), tp)
    return term.bytes, f"{speculative.method} draft {draft.name} {format_bytes(term.bytes)} ({term.formula})"


def _overheads(inputs: PlanInputs, batched: int, sampler_seqs: int) -> list[Term]:
    profile = inputs.profile
    if profile and profile.overhead_bytes is not None and profile.activation_bytes is None:
        return [
            Term(
                "overhead",
                profile.overhead_bytes,
                "measured",
                f"profile {profile.source}: requested - weights - available KV cache (activation peak + non-torch + CUDA graphs)",
            )
        ]
    return [_activation(inputs, batched, sampler_seqs), _non_torch(inputs), _cuda_graphs(inputs)]


def _activation(inputs: PlanInputs, batched: int, sampler_seqs: int) -> Term:
    spec, profile = inputs.spec, inputs.profile
    if profile and profile.activation_bytes is not None:
        return Term("activation", profile.activation_bytes, "measured", f"profile {profile.source}")
    forward = common.forward_activation_peak(spec, batched, inputs.tp)
    sampler = common.sampler_peak(spec, sampler_seqs)
    if forward >= sampler:
        which = f"forward over {batched} batched tokens"
    else:
        which = f"sampler logits for {sampler_seqs} sequences x {spec.vocab_size} vocab x {common.SAMPLER_BYTES_PER_LOGIT} B"
    return Term(
        "activation",
        max(forward, sampler),
        "estimate",
        f"profile-run peak, max(forward {forward} B, sampler {sampler} B): {which}",
        common.CALIBRATE_HINT,
    )


def _non_torch(inputs: PlanInputs) -> Term:
    profile, tp = inputs.profile, inputs.tp
    if profile and profile.non_torch_bytes is not None:
        return Term("non_torch", profile.non_torch_bytes, "measured", f"profile {profile.source}")
    buffers = ", NCCL and custom all-reduce (tp >= 2)" if tp > 1 else ""
    return Term(
        "non_torch",
        common.non_torch_estimate(tp),
        "estimate",
        f"CUDA/cuBLAS workspaces, attention buffers{buffers}",
        common.CALIBRATE_HINT,
    )


def _cuda_graphs(inputs: PlanInputs) -> Term:
    profile = inputs.profile
    if inputs.enforce_eager or inputs.device == "cpu":
        return Term(
            "cuda_graphs",
            0,
            "exact",
            "--enforce-eager" if inputs.enforce_eager else "the CPU build captures no CUDA graphs",
        )
    if profile and profile.cudagraph_bytes is not None:
        return Term(
            "cuda_graphs",
            profile.cudagraph_bytes,
            "measured",
            f"profile {profile.source}: 'Estimated CUDA graph memory'",
        )
    return Term(
        "cuda_graphs",
        common.CUDA_GRAPH_ESTIMATE,
        "estimate",
        "decode CUDA graphs, profiled by vLLM >= 0.21 before sizing KV (0 with --enforce-eager)",
        common.CALIBRATE_HINT,
    )


def _profile_mismatch(inputs: PlanInputs, batched: int) -> list[str]:
    profile, spec = inputs.profile, inputs.spec
    assert profile is not None
    out = []
    if profile.model and not _same_model(profile.model, spec):
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


def _same_model(name: str, spec: ModelSpec) -> bool:
    """A profile's model is this one: the same id or path, or the same last path segment (a local copy)."""
    return (
        name in (spec.name, spec.source_path) or name.rstrip("/").split("/")[-1] == spec.name.rstrip("/").split("/")[-1]
    )
