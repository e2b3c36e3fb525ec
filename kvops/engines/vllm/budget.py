"""vLLM: the memory budget the engine sizes its KV cache from, release by release (releases.py names each rule).

V1 takes `ceil(total x gpu_memory_utilization)` and subtracts what it measured: the weights, the activation peak of a
profile forward over `max_num_batched_tokens` tokens (and the sampler's logits for `max_num_seqs` sequences),
non-torch memory and, from 0.21, the CUDA-graph estimate; V0 subtracts the same from `total x utilization` and
captures its graphs afterwards. `--kv-cache-memory-bytes` replaces all of that with a fixed figure. How the KV bytes
become blocks is layout.py.

What only a run can measure (activation, non-torch, CUDA graphs) is the median of public startup logs of the same
release family (common.shipped_fit), plus a margin so that most logs got at least the KV planned; a profile's
measured figures replace them.
"""

from __future__ import annotations

from dataclasses import replace
from math import ceil, floor

from kvops.dtypes import serving_dtype
from kvops.engines import common
from kvops.engines.vllm.releases import BatchDefaults, VllmRelease, release
from kvops.errors import MissingDevice, UsageError
from kvops.model.checkpoint import Parallel
from kvops.model.spec import ModelSpec
from kvops.plan import PlanInputs, Term
from kvops.units import format_bytes

DEFAULT_GPU_MEMORY_UTILIZATION = release(None).default_gpu_memory_utilization  # the newest release's
GiB = 1 << 30

DEVICES = ("gpu", "cpu")

__all__ = ["BatchDefaults", "batch_defaults", "memory_terms", "resolve_batch"]


def batch_defaults(
    device: str,
    memory_bytes: int | None,
    gpu_name: str,
    world_size: int = 1,
    release_: VllmRelease | None = None,
    max_model_len: int = 0,
) -> BatchDefaults:
    """`EngineArgs.get_batch_defaults` for the OpenAI API server (`vllm serve`) of a release (default: the newest)."""
    return (release_ or release(None)).batch_defaults(device, memory_bytes, gpu_name, world_size, max_model_len)


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


def max_in_flight_tokens(max_num_batched_tokens: int, device: str, release_: VllmRelease | None = None) -> int:
    """Tokens a sliding-window request may hold beyond its window: `VllmConfig.max_in_flight_tokens` (two batches
    with async scheduling on the GPU, one on the CPU) from 0.25, one batch (`max_num_batched_tokens`) before."""
    if device == "cpu" or not (release_ or release(None)).sliding_counts_in_flight:
        return max_num_batched_tokens
    return 2 * max_num_batched_tokens


def requested_memory(total_bytes: int, utilization: float, release_: VllmRelease) -> int:
    """V1 `request_memory`: ceil(total x gpu_memory_utilization); V0 multiplies without rounding up."""
    return floor(total_bytes * utilization) if release_.v0 else ceil(total_bytes * utilization)


def profile_run(
    spec: ModelSpec, batched: int, sampler_seqs: int, tp: int, fmt_scope: str = "none"
) -> tuple[int, int, int]:
    """What the profile run holds, in kvops' model: the forward pass's peak over `batched` tokens (bytes), the logits
    of its sampler run for `sampler_seqs` sequences (the fitted bytes per logit make them bytes), and what stays
    allocated through the sampler run: the fused-MoE workspace, kept by the workspace manager across layers and steps
    (v1/worker/workspace.py; experts/triton_moe.py TritonExperts.workspace_shapes: (M, topk, max(I, H)) and
    (M, topk, max(2I, H)) per rank, M the batched tokens). MXFP4 experts run other kernels and keep none."""
    workspace = 0
    if spec.num_experts and fmt_scope != "experts":
        inter = ceil((spec.moe_intermediate_size or spec.intermediate_size) / tp)
        topk = max(1, spec.experts_per_token)
        workspace = batched * topk * (max(inter, spec.hidden_size) + max(2 * inter, spec.hidden_size)) * 2
    return common.forward_activation_peak(spec, batched, tp), common.sampler_logits(spec, sampler_seqs), workspace


# --- the memory terms -----------------------------------------------------------------------------------


def memory_terms(
    inputs: PlanInputs, release_: VllmRelease, batched: int, sampler_seqs: int, stage: int | None = None
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
        warnings += _profile_mismatch(inputs, release_, batched)
    weights = _weights(inputs, stage)
    overheads = _overheads(inputs, release_, batched, sampler_seqs)
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
    utilization = inputs.memory_fraction or release_.default_gpu_memory_utilization
    total = common.device_total_term(inputs)
    requested = requested_memory(total.bytes, utilization, release_)
    how = "ceil" if not release_.v0 else ""
    margin = _margin(inputs, release_, overheads)
    spent = overheads + ([margin] if margin else [])
    kv = requested - weights.bytes - sum(term.bytes for term in spent)
    return (
        [
            total,
            Term(
                "requested",
                requested,
                "computed",
                f"{how}({total.bytes} B x gpu_memory_utilization {utilization:g})"
                + ("" if inputs.memory_fraction else f" ({release_.label}'s default)"),
            ),
            weights,
            *spent,
            _kv_term(kv, release_, inputs, overheads, margin),
        ],
        kv,
        warnings,
    )


def _kv_term(kv: int, release_: VllmRelease, inputs: PlanInputs, overheads: list[Term], margin: Term | None) -> Term:
    names = " - ".join(term.name.replace("_", "-") for term in overheads)
    formula = f"requested - weights - {names}{' - margin' if margin else ''} (vLLM's available KV cache memory)"
    if not any(term.is_estimate for term in overheads):
        return Term("kv_cache", kv, "computed", formula)
    fit = _fit(inputs, release_)
    if margin is None:
        return Term("kv_cache", kv, "computed", f"{formula}; {fit.unbounded()}")
    below, above = fit.band()
    formula += (
        f"; KV {format_bytes(kv)}, -{format_bytes(below).lstrip('~')}/+{format_bytes(above).lstrip('~')}: where "
        f"{_logs(fit)} landed around their own predictions (each without its log)"
    )
    return Term("kv_cache", kv, "computed", formula, band=(kv - below, kv + above))


def _fit(inputs: PlanInputs, release_: VllmRelease) -> common.FamilyFit:
    fit = inputs.overhead_fit or common.shipped_fit("vllm")
    return fit.family(release_.family)


# MXFP4 MoE experts as the Marlin and TRT-LLM kernels lay them out: hidden to a multiple of 256, the intermediate
# size per rank to 128 (model_executor/layers/fused_moe/oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size;
# gpt-oss-120b on an H100 logs 65.97 GiB, 60.77 unpadded, 65.90 padded). ROCm kernels align both to 256.
MXFP4_ALIGNMENT = {"nvidia": (256, 128), "amd": (256, 256)}


def weight_options(inputs: PlanInputs) -> common.WeightOptions:
    """How vLLM splits and loads the weights: routed experts over tp x dp ranks (`FusedMoEParallelConfig.make`
    flattens data parallelism into the experts' split, whole experts per rank with --enable-expert-parallel),
    MXFP4 experts padded as its kernels lay them out."""
    parallel = Parallel(inputs.tp, inputs.pp, inputs.tp * inputs.replicas, inputs.expert_parallel)
    speculative = inputs.speculative
    vendor = inputs.gpu.vendor if inputs.gpu else "nvidia"
    alignment = MXFP4_ALIGNMENT.get(vendor, MXFP4_ALIGNMENT["nvidia"])
    return common.WeightOptions(
        parallel,
        serving_dtype=None if inputs.dtype == "auto" else inputs.dtype,
        text_only=inputs.text_only,
        load_mtp=speculative is not None and speculative.method == "mtp",
        expert_alignment=alignment,
    )


def _weights(inputs: PlanInputs, stage: int | None = None) -> Term:
    """The weights per GPU: a profile's measured figure (rescaled to this tp), else the checkpoint's computed size
    (experts padded as vLLM's kernels lay them out; a draft model or EAGLE head on the last stage; --cpu-offload-gb
    subtracted) plus the rotary cos/sin cache the model registers."""
    profile, tp, spec = inputs.profile, inputs.tp, inputs.spec
    if profile is not None and profile.weights_bytes is not None:
        measured, scaled = profile.weights_bytes, ""
        if profile.tp and profile.tp != tp:  # each rank holds 1/tp of the weights
            measured, scaled = ceil(profile.weights_bytes * profile.tp / tp), f", x {profile.tp}/{tp} for tp {tp}"
        return Term("weights", measured, "measured", f"profile {profile.source}: 'Model loading took'{scaled}", None)
    computed = _computed_weights(inputs, stage)
    width = rotary_width(inputs.dtype)
    rotary = rotary_cache_bytes(spec, width)
    if not rotary:
        return computed
    return replace(
        computed,
        bytes=computed.bytes + rotary,
        formula=f"{computed.formula}; + {format_bytes(rotary)} rotary cos/sin cache ({spec.max_position_embeddings:,} "
        f"positions x rotary dim x {width} B, model_executor/layers/rotary_embedding: RotaryEmbedding.cos_sin_cache)",
    )


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


def rotary_cache_bytes(spec: ModelSpec, width: int = 2) -> int:
    """vLLM's cos/sin cache: one row of rotary-dim values per position, `width` bytes each."""
    if not spec.max_position_embeddings:
        return 0
    rotary = next(
        (layer.qk_rope_head_dim for layer in spec.layers if spec.is_mla and hasattr(layer, "qk_rope_head_dim")), 0
    )
    return spec.max_position_embeddings * (rotary or spec.head_dim) * width


def rotary_width(dtype: str) -> int:
    """Bytes per cos/sin value: the cache is cast to torch's default dtype while vLLM builds the model, the serving
    dtype (`get_rope(dtype=torch.get_default_dtype())`, model_executor/layers/rotary_embedding/__init__.py): 4 B under
    --dtype float32, else 2 (--dtype auto serves a 16-bit dtype, float32 checkpoints included)."""
    return 4 if dtype != "auto" and serving_dtype(dtype) == "fp32" else 2


def _overheads(inputs: PlanInputs, release_: VllmRelease, batched: int, sampler_seqs: int) -> list[Term]:
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
    return [
        _activation(inputs, release_, batched, sampler_seqs),
        _non_torch(inputs, release_),
        _cuda_graphs(inputs, release_),
    ]


def _activation(inputs: PlanInputs, release_: VllmRelease, batched: int, sampler_seqs: int) -> Term:
    profile = inputs.profile
    if profile and profile.activation_bytes is not None:
        return Term("activation", profile.activation_bytes, "measured", f"profile {profile.source}")
    scope = common.weight_format(inputs.spec, inputs.quantization).scope
    forward, logits, workspace = profile_run(inputs.spec, batched, sampler_seqs, inputs.tp, scope)
    fit = _fit(inputs, release_)
    sampler = fit.sampler(logits) + workspace
    if forward >= sampler:
        which = f"the forward pass over {batched} batched tokens ({format_bytes(forward)})"
    else:
        which = (
            f"the sampler's decode step for {sampler_seqs} sequences x {inputs.spec.vocab_size:,} vocabulary at "
            f"{fit.sampler_bytes_per_logit:.1f} B per logit ({format_bytes(fit.sampler(logits))})"
        )
        if workspace:
            which += f" + the fused-MoE workspace over {batched} tokens ({format_bytes(workspace)})"
    return Term(
        "activation",
        fit.activation(forward, logits, workspace),
        "estimate",
        f"profile-run peak: {which} {_signed(fit.activation_excess)}, the median excess of {_logs(fit)} over "
        "kvops' model",
        common.CALIBRATE_HINT,
    )


def _non_torch(inputs: PlanInputs, release_: VllmRelease) -> Term:
    profile, tp = inputs.profile, inputs.tp
    if profile and profile.non_torch_bytes is not None:
        return Term("non_torch", profile.non_torch_bytes, "measured", f"profile {profile.source}")
    fit = _fit(inputs, release_)
    buffers = " with NCCL and custom all-reduce buffers" if tp > 1 else ""
    return Term(
        "non_torch",
        fit.non_torch_bytes(tp),
        "estimate",
        f"CUDA/cuBLAS workspaces, attention buffers{buffers}: the median of {_logs(fit)} at tp {'1' if tp == 1 else '>= 2'}",
        common.CALIBRATE_HINT,
    )


def _cuda_graphs(inputs: PlanInputs, release_: VllmRelease) -> Term:
    profile = inputs.profile
    if inputs.enforce_eager or inputs.device == "cpu":
        return Term(
            "cuda_graphs",
            0,
            "exact",
            "--enforce-eager" if inputs.enforce_eager else "the CPU build captures no CUDA graphs",
        )
    if not release_.cudagraphs_before_kv:
        return Term(
            "cuda_graphs",
            0,
            "exact",
            f"{release_.label} captures CUDA graphs after sizing the KV cache: they come out of the memory "
            "--gpu-memory-utilization leaves, not the KV budget",
        )
    if profile and profile.cudagraph_bytes is not None:
        return Term(
            "cuda_graphs",
            profile.cudagraph_bytes,
            "measured",
            f"profile {profile.source}: 'Estimated CUDA graph memory'",
        )
    fit = _fit(inputs, release_)
    return Term(
        "cuda_graphs",
        fit.cuda_graph_bytes(inputs.tp),
        "estimate",
        f"vLLM's CUDA-graph estimate, taken before sizing KV: the median of {_logs(fit)} at tp "
        f"{'1' if inputs.tp == 1 else '>= 2'} (0 with --enforce-eager)",
        common.CALIBRATE_HINT,
    )


def _margin(inputs: PlanInputs, release_: VllmRelease, overheads: list[Term]) -> Term | None:
    """Planned on top of the estimated overheads, so that most logs of the family got at least the KV planned."""
    fit = _fit(inputs, release_)
    if not any(term.is_estimate for term in overheads) or not fit.bounded:
        return None
    return Term(
        "margin",
        fit.margin,
        "estimate",
        f"with it, {common.OVERHEAD_QUANTILE:.0%} of {_logs(fit)} had at least the KV this plan leaves, each "
        "predicted without its own log (err toward less KV)",
        common.CALIBRATE_HINT,
    )


def _signed(size: int) -> str:
    return f"+ {format_bytes(size)}" if size >= 0 else f"- {format_bytes(-size)}"


def _logs(fit: common.FamilyFit) -> str:
    if fit.borrowed:
        return f"{fit.logs} public {fit.borrowed} startup logs (their CUDA-graph estimate taken from the KV budget, as {fit.family} does)"
    where = "public vLLM startup logs" if fit.family == common.POOLED else f"public {fit.family} startup logs"
    return f"{fit.logs} {where}"


def _profile_mismatch(inputs: PlanInputs, release_: VllmRelease, batched: int) -> list[str]:
    profile = inputs.profile
    assert profile is not None
    out = common.profile_mismatch(inputs, str(release_.version), release_.label)
    if profile.tp and profile.tp != inputs.tp:
        out.append(f"--profile was measured at tp {profile.tp}, the plan is for tp {inputs.tp}")
    if profile.max_num_batched_tokens and profile.max_num_batched_tokens != batched:
        out.append(
            f"--profile was measured with max_num_batched_tokens {profile.max_num_batched_tokens}, the plan uses {batched}: the activation peak scales with it"
        )
    return out
