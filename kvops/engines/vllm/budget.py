"""vLLM: the memory budget the engine sizes its KV cache from, release by release (releases.py names each rule).

V1 takes `ceil(total x gpu_memory_utilization)` and subtracts what it measured: the weights, the activation peak of a
profile forward over `max_num_batched_tokens` tokens (and the sampler's logits for `max_num_seqs` sequences),
non-torch memory and, from 0.21, the CUDA-graph estimate; V0 subtracts the same from `total x utilization` and
captures its graphs afterwards. `--kv-cache-memory-bytes` replaces all of that with a fixed figure. How the KV bytes
become blocks is layout.py.

What only a run can measure (activation, non-torch, CUDA graphs) is the median of public startup logs of the same
release family (kvops.shipped_fit), plus a margin so that most logs got at least the KV planned; a profile's
measured figures replace them.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from dataclasses import replace
from math import ceil, floor, log2

from kvops.dtypes import serving_dtype
from kvops.engines import common
from kvops.engines.device_total import device_total, device_total_term
from kvops.engines.overhead_fit import OVERHEAD_QUANTILE
from kvops.engines.vllm.lora import LoraBytes, lora_bytes
from kvops.engines.vllm.model_runner import ModelRunner, model_runner
from kvops.engines.vllm.releases import BatchDefaults, VllmRelease, release
from kvops.engines.weights import WeightOptions, stage_weights, weight_bytes, weight_format
from kvops.errors import MissingDevice, UsageError
from kvops.frozen import frozen
from kvops.model.checkpoint import Parallel
from kvops.model.spec import ModelSpec
from kvops.overheads import POOLED, FamilyFit, shipped_fit
from kvops.plan import PlanInputs, Term
from kvops.profile import Profile
from kvops.units import GiB, format_bytes

DEFAULT_GPU_MEMORY_UTILIZATION = release(None).default_gpu_memory_utilization  # the newest release's

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


def launch_defaults(inputs: PlanInputs, release_: VllmRelease, max_model_len: int) -> BatchDefaults:
    """vLLM's batching defaults for this launch: the release's for its device and GPUs, each doubled by
    `--performance-mode throughput` (engine/arg_utils.py `_set_default_max_num_seqs_and_batched_tokens_args`)."""
    gpu = inputs.gpu
    total = device_total(inputs) if gpu else None
    defaults = batch_defaults(inputs.device, total, gpu.name if gpu else "", inputs.tp, release_, max_model_len)
    if inputs.performance_mode != "throughput":
        return defaults
    return BatchDefaults(
        2 * defaults.max_num_batched_tokens,
        2 * defaults.max_num_seqs,
        f"{defaults.rule}, each doubled by --performance-mode throughput",
    )


def resolve_batch(
    defaults: BatchDefaults,
    max_model_len: int,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    chunked_prefill: bool = True,
) -> tuple[int, int]:
    """What `_set_default_max_num_seqs_and_batched_tokens_args` settles on (engine/arg_utils.py, 0.34.0): with chunked
    prefill off, a default token budget rises to max_model_len, so that a whole prompt fits one step."""
    seqs = max_num_seqs if max_num_seqs is not None else defaults.max_num_seqs
    tokens = max_num_batched_tokens
    if tokens is None:
        tokens = defaults.max_num_batched_tokens
        if not chunked_prefill:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return tokens, seqs


def max_in_flight_tokens(
    max_num_batched_tokens: int,
    device: str,
    release_: VllmRelease | None = None,
    async_scheduling: bool = True,
    pp: int = 1,
    v2_runner: bool = False,
) -> int:
    """Tokens a sliding-window request may hold beyond its window, from 0.25: `VllmConfig.max_in_flight_tokens`, a
    full batch for each of `max_concurrent_batches` (async scheduling is vLLM's default on the GPU; the CPU platform
    turns it off); one batch (`max_num_batched_tokens`) before 0.25."""
    release_ = release_ or release(None)
    if not release_.sliding_counts_in_flight:
        return max_num_batched_tokens
    return concurrent_batches(release_, async_scheduling and device != "cpu", pp, v2_runner) * max_num_batched_tokens


def async_scheduling(inputs: PlanInputs) -> bool:
    """vLLM's async scheduling: its default on a GPU (`VllmConfig`: on unless something rules it out), off with
    --no-async-scheduling and on the CPU, whose platform turns it off (platforms/cpu.py)."""
    return inputs.device != "cpu" and inputs.async_scheduling is not False


def concurrent_batches(release_: VllmRelease, async_scheduling: bool, pp: int, v2_runner: bool) -> int:
    """`VllmConfig.max_concurrent_batches`: a pipeline runs one batch per stage, async scheduling one more; in
    0.32-0.33 only Model Runner V2 adds it to a pipeline (config/vllm.py of those wheels; pipelines are not read
    before 0.32, where one stage's rule is kept: two batches with async scheduling)."""
    if not async_scheduling:
        return pp if release_.version.at_least(0, 32) else 1
    if pp <= 1 or not release_.version.at_least(0, 32):
        return 2
    return pp + 1 if v2_runner or release_.version.at_least(0, 34) else pp


def requested_memory(total_bytes: int, utilization: float, release_: VllmRelease) -> int:
    """V1 `request_memory`: ceil(total x gpu_memory_utilization); V0 multiplies without rounding up."""
    return floor(total_bytes * utilization) if release_.v0 else ceil(total_bytes * utilization)


def encoder_budget(spec: ModelSpec, batched: int) -> int:
    """The language-model tokens the encoder's profile batch yields: max_num_batched_tokens, or the most one image
    yields where that is more (v1/core/encoder_cache_manager.py compute_mm_encoder_budget: max(
    max_num_encoder_input_tokens, max_tokens_per_mm_item); a 0.19.0 log of Qwen3.5-9B at 8,192 batched tokens:
    'Encoder cache will be initialized with a budget of 16384 tokens')."""
    return max(batched, spec.encoder.max_item_tokens) if spec.encoder else batched


def encoder_pass(spec: ModelSpec, batched: int, tp: int = 1, text_only: bool = False) -> tuple[int, int]:
    """The multimodal encoder's share of the profile run (v1/worker/gpu/model_runner.py profile_run, 0.34.0:
    `profile_encoder_cache` runs the encoder on a dummy batch of the encoder budget and keeps its outputs in the
    encoder cache through the decoder's dummy run): the encoder's forward peak over that batch's patches per GPU (a
    ViT layer's widest activations, as the decoder's forward pass is modelled: the residual stream whole, attention
    and MLP split by tp, vLLM's default mm_encoder_tp_mode "weights"), and the cached outputs (tokens x the text
    width, 2 B each). (0, 0) without an encoder or with --language-model-only."""
    encoder = spec.encoder
    if encoder is None or text_only:
        return 0, 0
    tokens = encoder_budget(spec, batched)
    patches = tokens * encoder.patches_per_token
    forward = ceil(patches * (3 * encoder.width + max(4 * encoder.width, 2 * encoder.intermediate) / tp) * 2)
    return forward, tokens * spec.hidden_size * 2


def profile_run(
    spec: ModelSpec, batched: int, sampler_seqs: int, tp: int, fmt_scope: str = "none", text_only: bool = False
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
    forward = common.forward_activation_peak(spec, batched, tp)
    encoder, cached = encoder_pass(spec, batched, tp, text_only)
    return max(forward + cached, encoder), common.sampler_logits(spec, sampler_seqs), workspace


# --- the memory terms -----------------------------------------------------------------------------------


@frozen
class KvSizing:
    """How this launch's vLLM sizes its KV cache, and why (`VllmConfig._resolve_extensible_kv_cache`, 0.34.0)."""

    path: str  # "extensible", "profiler", "pinned" (--kv-cache-memory-bytes) or "blocks" (--num-gpu-blocks-override)
    why: str

    @property
    def extensible(self) -> bool:
        return self.path == "extensible"

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "why": self.why}


_RESOLVE = "vllm/config/vllm.py _resolve_extensible_kv_cache (0.34.0)"


def kv_sizing(inputs: PlanInputs, release_: VllmRelease) -> KvSizing:
    """The sizing path vLLM takes for this launch: the extensible KV cache on CUDA and ROCm from 0.34 unless a
    fixed size, a fixed block count, the CPU build, --no-enable-extensible-kv-cache or a driver without VMM turns
    it off; the profiler before 0.34. Asking for it where vLLM cannot is vLLM's own one-line error."""
    fixed = _fixed_size(inputs)
    if not release_.extensible_by_default:
        if inputs.extensible_kv_cache:
            raise UsageError(f"--enable-extensible-kv-cache: {release_.label} has no extensible KV cache (from 0.34.0)")
        return fixed or KvSizing("profiler", f"{release_.label} sizes KV from its memory profile")
    unsupported = None
    if inputs.device == "cpu":
        unsupported = "it is only supported on CUDA and ROCm"
    elif fixed is not None:
        unsupported = f"it sizes the KV cache from measured memory, which {fixed.why} overrides"
    if unsupported and inputs.extensible_kv_cache:
        raise UsageError(f"--enable-extensible-kv-cache: vLLM refuses it: 'enable_extensible_kv_cache: {unsupported}.'")
    if fixed is not None:
        return fixed
    if unsupported:
        return KvSizing("profiler", f"the extensible KV cache is off: {unsupported} ({_RESOLVE})")
    if inputs.extensible_kv_cache is False:
        return KvSizing("profiler", "--no-enable-extensible-kv-cache: sized from the memory profile")
    if not inputs.vmm:
        if inputs.extensible_kv_cache:
            raise UsageError(
                "--enable-extensible-kv-cache with --no-vmm: vLLM needs the driver's virtual memory management"
            )
        return KvSizing(
            "profiler",
            "the driver has no virtual memory management (--no-vmm): vLLM disables the extensible KV cache and sizes "
            "from the memory profile (v1/executor/abstract.py disable_extensible_kv_cache)",
        )
    return KvSizing(
        "extensible",
        f"{release_.label} on {'ROCm' if _rocm(inputs) else 'CUDA'}: the extensible KV cache, sized after warmup and "
        f"CUDA-graph capture from the memory actually free ({_RESOLVE})",
    )


def _fixed_size(inputs: PlanInputs) -> KvSizing | None:
    if inputs.kv_cache_memory_bytes is not None:
        return KvSizing("pinned", "kv_cache_memory_bytes")
    if inputs.num_gpu_blocks_override is not None:
        return KvSizing("blocks", "num_gpu_blocks_override")
    return None


def _rocm(inputs: PlanInputs) -> bool:
    return inputs.gpu is not None and inputs.gpu.vendor == "amd"


# extensible_kv_cache.py (0.34.0): KV_CACHE_MARGIN_FLOOR_BYTES = (3 if ROCm else 1) << 30, KV_CACHE_MARGIN_FRACTION
MARGIN_FLOOR = {"nvidia": 1 * GiB, "amd": 3 * GiB}
MARGIN_FRACTION = 0.75
# Memory in use before vLLM's init snapshot (the CUDA context, NCCL: `init_snapshot.free_memory` is taken after them,
# so the extensible KV cache's headroom starts below the total): total - free at startup in public logs printing
# "Free memory on device (F/T GiB) on startup": L4 tp 1 0.25 GiB (unslothai/notebooks nb/Qwen3_8B_FP8_GRPO.ipynb),
# L40S tp 8 0.49 GiB (vLLM 0.10.2, code-index id 38962983769), B200 tp 1 0.70 GiB (vllm-project/vllm PR #21489);
# the median is taken (an estimate: the calibration's measured total replaces it)
STARTUP_USED = round(0.49 * GiB)


@frozen
class Sequences:
    """The max-num-seqs the overheads are sized for: the profile's sampler runs the launch's own (kvops' choice
    included, as emitted); the CUDA-graph estimate takes the user's or vLLM's default, never kvops' smaller choice,
    which would leave a smaller card's plan more KV than a larger one's (it errs toward the larger estimate)."""

    sampler: int
    captured: int


def memory_terms(
    inputs: PlanInputs,
    release_: VllmRelease,
    batched: int,
    seqs: Sequences,
    stage: int | None = None,
    sizing: KvSizing | None = None,
) -> tuple[list[Term], int, list[str]]:
    """Every term of the per-GPU budget, the KV bytes the capacity is sized on (the engine's predicted figure less
    kvops' margin, when one is planned), and warnings about a profile that may not apply; with pipeline
    parallelism, of one stage (None: the stage holding the most weights)."""
    gpu, profile = inputs.gpu, inputs.profile
    warnings: list[str] = []
    if profile and profile.engine != "vllm":
        raise UsageError(
            f"--profile is a {profile.engine} profile; plan --engine {profile.engine} with it, or calibrate a vLLM run"
        )
    if profile:
        warnings += _profile_mismatch(inputs, release_, batched)
    slots = _lora_slots(inputs)
    if inputs.lora is not None and slots is None:
        warnings.append(LORA_NOT_LAID_OUT.format(architecture=", ".join(inputs.spec.architectures) or "this model"))
    weights = _weights(inputs, slots, stage)
    overheads = _overheads(inputs, release_, batched, seqs)
    if inputs.kv_cache_memory_bytes is not None:
        return _pinned_terms(inputs, weights, overheads) + (warnings,)
    if gpu is None and inputs.device == "cpu":
        raise MissingDevice(
            "--device cpu: give the KV cache's size with --kv-cache-memory-bytes (vLLM's CPU build takes it from that "
            "flag or VLLM_CPU_KVCACHE_SPACE), or the host memory it may use with --gpu-memory"
        )
    if gpu is None:
        raise MissingDevice(
            "missing --gpu NAME or --gpu-memory SIZE (or pin the KV cache with --kv-cache-memory-bytes)"
        )
    utilization = inputs.memory_fraction or release_.default_gpu_memory_utilization
    total = device_total_term(inputs)
    requested = requested_memory(total.bytes, utilization, release_)
    how = "ceil" if not release_.v0 else ""
    requested_term = Term(
        "requested",
        requested,
        "computed",
        f"{how}({total.bytes} B x gpu_memory_utilization {utilization:g})"
        + ("" if inputs.memory_fraction else f" ({release_.label}'s default)"),
    )
    if sizing is not None and sizing.extensible:
        spent, engine_kv = _extensible(inputs, total, requested, weights, overheads, batched, seqs.sampler)
        kv_term = Term(
            "kv_cache",
            engine_kv,
            "computed",
            "min(requested - resident, total - startup_used - resident - vllm_margin) - transient, resident = "
            "weights + non-torch + CUDA graphs + persistent, transient = activation - persistent (vLLM's "
            "measure_kv_cache_bytes, extensible_kv_cache.py l.592-618; no CUDA-graph estimate is kept free: "
            "profile_cudagraph_memory returns 0 under the extensible cache, whose measurement finds the captured "
            "graphs resident, gpu/model_runner.py l.1123-1125)",
        )
    else:
        spent = overheads
        engine_kv = requested - weights.bytes - sum(term.bytes for term in overheads)
        names = " - ".join(term.name.replace("_", "-") for term in overheads)
        kv_term = Term(
            "kv_cache", engine_kv, "computed", f"requested - weights - {names} (vLLM's available KV cache memory)"
        )
    margin = _margin(inputs, release_, overheads)
    terms = [total, requested_term, weights, *spent, _kv_term(kv_term, release_, inputs, overheads, margin)]
    if margin is not None:
        terms.append(margin)
    return terms, engine_kv - (margin.bytes if margin else 0), warnings


def _pinned_terms(inputs: PlanInputs, weights: Term, overheads: list[Term]) -> tuple[list[Term], int]:
    kv = inputs.kv_cache_memory_bytes
    assert kv is not None
    kv_term = Term(
        "kv_cache", kv, "input", "--kv-cache-memory-bytes: vLLM skips its memory profile and allocates exactly this"
    )
    if inputs.gpu is None:
        return [weights, kv_term], kv  # nothing to check the other terms against
    total = device_total_term(inputs)
    used = weights.bytes + sum(term.bytes for term in overheads) + kv
    headroom = Term(
        "headroom", total.bytes - used, "computed", "total - weights - activation - non-torch - CUDA graphs - KV cache"
    )
    return [total, weights, *overheads, kv_term, headroom], kv


def _extensible(
    inputs: PlanInputs,
    total: Term,
    requested: int,
    weights: Term,
    overheads: list[Term],
    batched: int,
    sampler_seqs: int,
) -> tuple[list[Term], int]:
    """vLLM 0.34's measured sizing on kvops' terms: what stays resident after warmup and capture, what is kept free
    for transients, the memory in use before its startup snapshot, and vLLM's own margin."""
    named = {term.name: term for term in overheads}
    activation = named.get("activation") or named.get("overhead")
    assert activation is not None
    graphs = named.get("cuda_graphs", Term("cuda_graphs", 0, "exact", ""))
    non_torch = named.get("non_torch", Term("non_torch", 0, "exact", ""))
    persistent = _persistent(inputs, batched, sampler_seqs) if "activation" in named else 0
    transient = max(0, activation.bytes - persistent)
    floor = MARGIN_FLOOR["amd" if _rocm(inputs) else "nvidia"]
    vllm_margin = max(floor, int(transient * MARGIN_FRACTION))
    resident = weights.bytes + non_torch.bytes + graphs.bytes + persistent
    startup = _startup_used(inputs)
    engine_kv = max(0, min(requested - resident, total.bytes - startup.bytes - resident - vllm_margin) - transient)
    margin_term = Term(
        "vllm_margin",
        vllm_margin,
        "computed",
        f"max({format_bytes(floor)}, 0.75 x transient {format_bytes(transient)}) (KV_CACHE_MARGIN_FLOOR_BYTES"
        f"{', ROCm' if _rocm(inputs) else ''}, KV_CACHE_MARGIN_FRACTION, extensible_kv_cache.py)",
    )
    return [*overheads, startup, margin_term], engine_kv


def _persistent(inputs: PlanInputs, batched: int, sampler_seqs: int) -> int:
    """Bytes of the activation peak that stay allocated after the profile (the fused-MoE workspace): resident, not
    transient, under the extensible KV cache."""
    scope = weight_format(inputs.spec, inputs.quantization).scope
    return profile_run(inputs.spec, batched, sampler_seqs, inputs.tp, scope, inputs.text_only)[2]


def _startup_used(inputs: PlanInputs) -> Term:
    profile = inputs.profile
    if profile and profile.startup_used_bytes is not None:
        return Term(
            "startup_used",
            profile.startup_used_bytes,
            "measured",
            f"profile {profile.source}: total - free at startup (the CUDA context, NCCL, other processes)",
        )
    return Term(
        "startup_used",
        STARTUP_USED,
        "estimate",
        "memory in use before vLLM's startup snapshot (CUDA context, NCCL): the median of 3 public logs' total - "
        "free at startup (L4 0.25, L40S 0.49, B200 0.70 GiB)",
        common.CALIBRATE_HINT,
    )


def _kv_term(
    kv_term: Term, release_: VllmRelease, inputs: PlanInputs, overheads: list[Term], margin: Term | None
) -> Term:
    if not any(term.is_estimate for term in overheads):
        return kv_term
    fit = _fit(inputs, release_)
    if margin is None:
        return replace(kv_term, formula=f"{kv_term.formula}; {fit.unbounded()}")
    below, above = fit.band()
    capacity = kv_term.bytes - margin.bytes
    formula = (
        f"{kv_term.formula}; the capacity is sized on KV - margin = {format_bytes(capacity)}, "
        f"-{format_bytes(below).lstrip('~')}/+{format_bytes(above).lstrip('~')}: where "
        f"{_logs(fit)} landed around their own predictions (each without its log)"
    )
    return replace(kv_term, formula=formula, band=(capacity - below, capacity + above))


def _fit(inputs: PlanInputs, release_: VllmRelease) -> FamilyFit:
    fit = inputs.overhead_fit or shipped_fit("vllm")
    return fit.family(release_.family)


# MXFP4 MoE experts as the Marlin and TRT-LLM kernels lay them out: hidden to a multiple of 256, the intermediate
# size per rank to 128 (model_executor/layers/fused_moe/oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size;
# gpt-oss-120b on an H100 logs 65.97 GiB, 60.77 unpadded, 65.90 padded). ROCm kernels align both to 256.
MXFP4_ALIGNMENT = {"nvidia": (256, 128), "amd": (256, 256)}


def weight_options(inputs: PlanInputs) -> WeightOptions:
    """How vLLM splits and loads the weights: routed experts over tp x dp ranks (`FusedMoEParallelConfig.make`
    flattens data parallelism into the experts' split, whole experts per rank with --enable-expert-parallel),
    MXFP4 experts padded as its kernels lay them out."""
    parallel = Parallel(inputs.tp, inputs.pp, inputs.tp * inputs.replicas, inputs.expert_parallel)
    speculative = inputs.speculative
    vendor = inputs.gpu.vendor if inputs.gpu else "nvidia"
    alignment = MXFP4_ALIGNMENT.get(vendor, MXFP4_ALIGNMENT["nvidia"])
    return WeightOptions(
        parallel,
        serving_dtype=None if inputs.dtype == "auto" else inputs.dtype,
        text_only=inputs.text_only,
        load_mtp=speculative is not None and speculative.method == "mtp",
        expert_alignment=alignment,
    )


def _weights(inputs: PlanInputs, slots: LoraBytes | None, stage: int | None = None) -> Term:
    """What vLLM's load holds per GPU ('Model loading took'): the weights, and the LoRA slots with --enable-lora."""
    weights = _model_weights(inputs, stage)
    if slots is None:
        return weights
    return replace(
        weights,
        bytes=weights.bytes + slots.bytes,
        formula=f"{weights.formula}; + {format_bytes(slots.bytes)} LoRA slots ({slots.formula})",
    )


LORA_NOT_LAID_OUT = (
    "--enable-lora: the LoRA slots of {architecture} are not counted (kvops lays them out for the text models of "
    "Llama, Mistral, Qwen2, Qwen3, Gemma 2 and 3, Granite, GLM-4, EXAONE, Mixtral and Qwen3-MoE, without expert "
    "parallelism): the KV cache planned is larger than vLLM's by them; measure the run (kvops calibrate)"
)


def _lora_slots(inputs: PlanInputs) -> LoraBytes | None:
    """The LoRA slots' bytes per GPU (None without --enable-lora, or where kvops does not lay them out: the plan
    says so), at --lora-dtype's width (auto: the serving dtype's)."""
    if inputs.lora is None:
        return None
    width = serving_width(inputs.dtype) if inputs.lora.dtype == "auto" else 2
    return lora_bytes(inputs.spec, inputs.lora, inputs.tp, inputs.pp, width, inputs.expert_parallel)


def _model_weights(inputs: PlanInputs, stage: int | None) -> Term:
    """The weights per GPU: a profile's measured figure (rescaled to this tp), else the checkpoint's computed size
    (experts padded as vLLM's kernels lay them out; a draft model or EAGLE head on the last stage; --cpu-offload-gb
    subtracted) plus the rotary cos/sin cache the model registers."""
    profile, tp, spec = common.model_measurements(inputs), inputs.tp, inputs.spec
    if profile is not None and profile.weights_bytes is not None:
        measured, scaled = profile.weights_bytes, ""
        if profile.tp and profile.tp != tp:  # each rank holds 1/tp of the weights
            measured, scaled = ceil(profile.weights_bytes * profile.tp / tp), f", x {profile.tp}/{tp} for tp {tp}"
        return Term("weights", measured, "measured", f"profile {profile.source}: 'Model loading took'{scaled}", None)
    computed = _computed_weights(inputs, stage)
    width = serving_width(inputs.dtype)
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
    term, stages = stage_weights(inputs.spec, weight_format(inputs.spec, inputs.quantization), weight_options(inputs))
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
    term = weight_bytes(draft, weight_format(draft), tp)
    return term.bytes, f"{speculative.method} draft {draft.name} {format_bytes(term.bytes)} ({term.formula})"


def rotary_cache_bytes(spec: ModelSpec, width: int = 2) -> int:
    """vLLM's cos/sin cache: one row of rotary-dim values per position, `width` bytes each."""
    if not spec.max_position_embeddings:
        return 0
    rotary = next(
        (layer.qk_rope_head_dim for layer in spec.layers if spec.is_mla and hasattr(layer, "qk_rope_head_dim")), 0
    )
    return spec.max_position_embeddings * (rotary or spec.head_dim) * width


def serving_width(dtype: str) -> int:
    """Bytes per value of the serving dtype, in which vLLM builds the model: the rotary cos/sin cache is cast to it
    (`get_rope(dtype=torch.get_default_dtype())`, model_executor/layers/rotary_embedding/__init__.py) and the logits
    come out in it: 4 B under --dtype float32, else 2 (--dtype auto serves a 16-bit dtype, float32 checkpoints
    included)."""
    return 4 if dtype != "auto" and serving_dtype(dtype) == "fp32" else 2


def _overheads(inputs: PlanInputs, release_: VllmRelease, batched: int, seqs: Sequences) -> list[Term]:
    profile = common.model_measurements(inputs)
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
        _activation(inputs, release_, batched, seqs.sampler),
        _non_torch(inputs, release_),
        _cuda_graphs(inputs, release_, batched, seqs.captured),
    ]


def _activation(inputs: PlanInputs, release_: VllmRelease, batched: int, sampler_seqs: int) -> Term:
    profile = common.model_measurements(inputs)
    if profile and profile.activation_bytes is not None:
        return Term("activation", profile.activation_bytes, "measured", f"profile {profile.source}")
    scope = weight_format(inputs.spec, inputs.quantization).scope
    forward, logits, workspace = profile_run(inputs.spec, batched, sampler_seqs, inputs.tp, scope, inputs.text_only)
    fit = _fit(inputs, release_)
    runner = model_runner_of(inputs, release_)
    fitted, held = sampler_run(inputs, runner, logits, workspace)
    sampler = fit.sampler(fitted) + held
    encoder, cached = encoder_pass(inputs.spec, batched, inputs.tp, inputs.text_only)
    if forward >= sampler and encoder and encoder >= forward:
        budget = encoder_budget(inputs.spec, batched)
        which = (
            f"the multimodal encoder's profile pass over {budget} tokens' "
            f"{budget * inputs.spec.encoder.patches_per_token:,} patches ({format_bytes(encoder)})"  # type: ignore[union-attr]
        )
    elif forward >= sampler:
        which = f"the forward pass over {batched} batched tokens ({format_bytes(forward - cached)})"
        if cached:
            which += f" + the encoder cache it holds ({format_bytes(cached)})"
    else:
        which = _sampler_peak(inputs, runner, fit, sampler_seqs, sampler - workspace)
        if workspace:
            which += f" + the fused-MoE workspace over {batched} tokens ({format_bytes(workspace)})"
    return Term(
        "activation",
        fit.activation(forward, fitted, held),
        "estimate",
        f"profile-run peak: {which} {_signed(fit.activation_excess)}, the median excess of {_logs(fit)} over "
        "kvops' model",
        common.CALIBRATE_HINT,
    )


def _sampler_peak(inputs: PlanInputs, runner: ModelRunner, fit: FamilyFit, sequences: int, logits_bytes: int) -> str:
    """The profile's sampler run, as the activation term explains its peak."""
    if runner.light_sampler:
        per_logit = runner.sampler_bytes_per_logit(serving_width(inputs.dtype))
        held = "the logits and their fp32 copy" if runner.fp32_copy else "the logits alone"
        how = f"{per_logit} B per logit, Model Runner V2: {held}"
    else:
        how = f"{fit.sampler_bytes_per_logit:.1f} B per logit"
        if runner.v2:
            how += ", Model Runner V2 sampling again with its warmup's parameters"
    return (
        f"the sampler's decode step for {sequences} sequences x {inputs.spec.vocab_size:,} vocabulary at {how} "
        f"({format_bytes(logits_bytes)})"
    )


def model_runner_of(inputs: PlanInputs, release_: VllmRelease, logged_v2: bool = False) -> ModelRunner:
    """The GPU model runner this launch's engine uses (`model_runner.model_runner`; every release before 0.22, the
    V0 engine's included, runs V1's)."""
    method = inputs.speculative.method if inputs.speculative else None
    return model_runner(release_.version, inputs.spec, _rocm(inputs), method, logged_v2)


def sampler_run(inputs: PlanInputs, runner: ModelRunner, logits: int, workspace: int) -> tuple[int, int]:
    """The profile sampler run as the overhead fit prices it: the logits priced at the family's fitted bytes per
    logit (the full sampling pipeline), and the bytes held beside them (the fused-MoE workspace). Model Runner V2's
    light sampler run (0.22-0.32) holds its logits at bytes set by the release (the model's dtype, and an fp32 copy
    before 0.26): they join what is held, and none are fitted."""
    if not runner.light_sampler:
        return logits, workspace
    return 0, workspace + logits * runner.sampler_bytes_per_logit(serving_width(inputs.dtype))


def _non_torch(inputs: PlanInputs, release_: VllmRelease) -> Term:
    profile, tp = inputs.profile, inputs.tp
    if profile and profile.non_torch_bytes is not None:
        return Term("non_torch", profile.non_torch_bytes, "measured", f"profile {profile.source}")
    fit = _fit(inputs, release_)
    custom, why = custom_all_reduce(inputs)
    if tp == 1:
        buffers, where = "", "tp 1"
    elif custom or fit.non_torch_nccl is None:
        buffers, where = " with NCCL and custom all-reduce buffers", "tp >= 2 with custom all-reduce"
        if not custom:
            where += f" (no log without it yet; {why})"
    else:
        buffers, where = f" with NCCL buffers, no custom all-reduce ({why})", "tp >= 2 without custom all-reduce"
    return Term(
        "non_torch",
        fit.non_torch_bytes(tp, custom),
        "estimate",
        f"CUDA/cuBLAS workspaces, attention buffers{buffers}: the median of {_logs(fit)} at {where}",
        common.CALIBRATE_HINT,
    )


# GeForce cards have no peer access over PCIe (NVIDIA leaves P2P off on them): vLLM's `_can_p2p` check fails
GEFORCE = ("RTX-3090", "RTX-4090", "RTX-5090")
CUSTOM_ALL_REDUCE_SIZES = (2, 4, 6, 8, 16)  # CustomAllreduce._SUPPORTED_WORLD_SIZES


def custom_all_reduce(inputs: PlanInputs) -> tuple[bool, str]:
    """Whether vLLM's custom all-reduce runs at this tp (its IPC buffers are non-torch memory), and why not: it
    needs a supported world size, GPUs fully connected (NVLink, xGMI) or only two of them, peer access between
    them, and no --disable-custom-all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py
    CustomAllreduce.__init__, l.212-290 in the 0.34.0 wheel: "not supported on more than two PCIe-only GPUs",
    "your platform lacks GPU P2P capability")."""
    if inputs.tp == 1:
        return False, "tp 1"
    if not inputs.custom_all_reduce:
        return False, "--disable-custom-all-reduce"
    if inputs.device != "gpu" or inputs.gpu is None:
        return False, "not a GPU"
    if inputs.tp not in CUSTOM_ALL_REDUCE_SIZES:
        return False, f"tp {inputs.tp} is not a size custom all-reduce supports"
    kind = interconnect(inputs.gpu.id)
    if kind in ("nvlink", "xgmi"):
        return True, f"{kind} connects the GPUs"
    if inputs.gpu.id in GEFORCE:
        return False, f"{inputs.gpu.id} cards have no peer access over PCIe"
    if inputs.tp > 2:
        return False, f"more than two PCIe-only GPUs ({inputs.gpu.id})"
    return True, "two PCIe GPUs with peer access"


def interconnect(gpu_id: str) -> str | None:
    """How a part's GPUs connect in its usual server (kvops/catalog/gpu_performance.json: nvlink, xgmi, pcie)."""
    from kvops.gpus import gpu_performance

    found = gpu_performance(gpu_id)
    return found.interconnect if found is not None else None


_GRAPHS_ESTIMATE = "vLLM's CUDA-graph estimate, taken before sizing KV"
_GRAPHS_EXTENSIBLE = (
    "the captured CUDA graphs, resident when the extensible cache measures free memory (sized as vLLM's estimate)"
)


def _cuda_graphs(inputs: PlanInputs, release_: VllmRelease, batched: int, max_num_seqs: int) -> Term:
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
    graphs = _captured(inputs, release_, batched, max_num_seqs)
    if graphs.mode == "NONE":
        return Term("cuda_graphs", 0, "exact", f"--compilation-config cudagraph_mode NONE: {graphs.why}")
    if profile and profile.cudagraph_bytes is not None:
        return _profiled_graphs(profile, profile.cudagraph_bytes, graphs)
    fit = _fit(inputs, release_)
    median = fit.cuda_graph_bytes(inputs.tp)
    scaled = median * graphs.captures // DEFAULT_CAPTURES
    scale = (
        f"; x {graphs.captures}/{DEFAULT_CAPTURES} capture sizes ({graphs.why})"
        if graphs.captures != DEFAULT_CAPTURES
        else ""
    )
    return Term(
        "cuda_graphs",
        scaled,
        "estimate",
        f"{_GRAPHS_EXTENSIBLE if release_.extensible else _GRAPHS_ESTIMATE}: the median of {_logs(fit)} at tp "
        f"{'1' if inputs.tp == 1 else '>= 2'} (0 with --enforce-eager){scale}",
        common.CALIBRATE_HINT,
    )


def _profiled_graphs(profile: Profile, measured_bytes: int, graphs: CompiledGraphs) -> Term:
    """The run's own figure (its estimate; under the extensible KV cache, the graphs it captured); for another number
    of capture sizes (another --max-num-seqs, say), scaled by their number, as the fitted estimate is."""
    measured = (
        f"profile {profile.source}: the run's CUDA-graph memory ('Estimated CUDA graph memory'; under the extensible "
        "KV cache, the graphs it captured)"
    )
    runs = profile.cudagraph_captures
    if not runs or runs == graphs.captures:
        return Term("cuda_graphs", measured_bytes, "measured", measured)
    return Term(
        "cuda_graphs",
        measured_bytes * graphs.captures // runs,
        "estimate",
        f"{measured} for its {runs} capture sizes, x {graphs.captures}/{runs} ({graphs.why})",
        common.CALIBRATE_HINT,
    )


@frozen
class CompiledGraphs:
    """The CUDA graphs a --compilation-config asks for: the mode, and the batch sizes (tokens) captured."""

    mode: str
    sizes: tuple[int, ...]  # ascending
    why: str
    lora_cases: int = 1  # graphs captured at each size: with LoRA, one with adapters active and one without

    @property
    def captures(self) -> int:
        return len(self.sizes) * self.lora_cases


def capture_sizes(largest: int, interactive: bool = False) -> list[int]:
    """vLLM's default capture sizes up to `largest`: 1, 2, 4 (every size up to 32 with `--performance-mode
    interactivity`), multiples of 8 below 256, multiples of 16 from it (config/vllm.py
    VllmConfig._set_cudagraph_sizes, l.2322-2335 and l.2470-2489 in the 0.34.0 wheel)."""
    small = range(1, 33) if interactive else (1, 2, 4)
    sizes = {size for size in small if size <= largest}
    sizes |= set(range(8, min(largest + 1, 256), 8))
    sizes |= set(range(256, largest + 1, 16))
    return sorted(sizes)


# the public logs the estimate is fitted on captured vLLM's default on an H100: sizes up to 512 (max_num_seqs 1024 x 2,
# capped at 512: config/vllm.py l.2400-2408), 51 of them
DEFAULT_CAPTURES = len(capture_sizes(512))
# data-center Blackwell (compute capability 10.x): from 0.28.0 vLLM's default capture ceiling there is 1024, not 512
# (config/vllm.py `default_max_graph_size`, `is_device_capability_family(100)`)
CAPABILITY_10 = frozenset({"B200", "GB200", "B300", "GB300"})


def default_captures(inputs: PlanInputs, release_: VllmRelease, batched: int, max_num_seqs: int) -> CompiledGraphs:
    """The batch sizes vLLM captures by default for this launch (config/vllm.py `_set_cudagraph_sizes`, 0.19-0.34):
    up to min(max_num_batched_tokens, 2 x max_num_seqs x the decode query length (1 + speculative tokens), 512 or
    1024 on data-center Blackwell), with max_num_batched_tokens and the uniform decode sizes (max_num_seqs; with
    speculative decoding each request count's decode width) where they are below that ceiling. The fitted estimate
    is scaled by their number: the estimate vLLM logs grows with it (an H200 serving Llama-3.2-1B on vLLM 0.31.0
    estimated 0.52 GiB for its default 51 sizes, 0.11 GiB for the 11 of --max-num-seqs 32)."""
    blackwell = inputs.gpu is not None and inputs.gpu.id in CAPABILITY_10 and release_.version.at_least(0, 28)
    platform_ceiling = 1024 if blackwell else 512
    query = 1 + (inputs.speculative.tokens if inputs.speculative else 0)
    ceiling = min(batched, 2 * max_num_seqs * query, platform_ceiling)
    decode = {max_num_seqs}
    if query > 1:  # each request count up to max_num_seqs, at its decode width
        requests = min(max_num_seqs, platform_ceiling)
        decode = {count * query for count in [*capture_sizes(requests), requests]}
    interactive = inputs.performance_mode == "interactivity"
    sizes = set(capture_sizes(ceiling, interactive)) | {size for size in (batched, *decode) if size <= ceiling}
    why = f"vLLM's default capture sizes up to {ceiling}" + (
        ", every size up to 32 (interactivity)" if interactive else ""
    )
    if ceiling != 512:
        why += f" (max_num_batched_tokens {batched}, max_num_seqs {max_num_seqs}, decode query length {query})"
    wide_decode, wide_prefill = wide_grids(inputs, release_, batched, max_num_seqs)
    if wide_decode:
        why = (
            f"{release_.label} on {inputs.gpu.id if inputs.gpu else 'this GPU'} captures {len(wide_decode)} decode "
            f"graphs (to {wide_decode[-1]} requests) and {len(wide_prefill)} prefill graphs (to {wide_prefill[-1]} "
            f"tokens); priced as {why}, as 0.28-0.33 capture there: no public 0.34 Blackwell log measures its graphs, "
            f"and prefill graphs to {wide_prefill[-1]} tokens may take more"
        )
    return CompiledGraphs("default", tuple(sorted(sizes)), why)


def compiled_graphs(
    text: str | None, default: CompiledGraphs, batched: int, interactive: bool = False
) -> CompiledGraphs:
    """What a --compilation-config (JSON) says of the CUDA graphs: cudagraph_mode NONE captures none; explicit
    cudagraph_capture_sizes or max_cudagraph_capture_size scale the fitted estimate by the number of sizes
    captured (an estimate: vLLM's graph pool grows with the captures, vllm-project/vllm#45178); else the
    launch's default sizes."""
    if not text:
        return default
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        raise UsageError(f"--compilation-config {text!r} is not a JSON object") from None
    if not isinstance(config, dict):
        raise UsageError(f"--compilation-config {text!r} is not a JSON object")
    mode = str(config.get("cudagraph_mode") or "default").upper()
    if mode != "DEFAULT" and mode not in CUDAGRAPH_MODES:
        raise UsageError(
            f"--compilation-config cudagraph_mode {config['cudagraph_mode']!r} is not a mode vLLM has; valid: "
            f"{', '.join(CUDAGRAPH_MODES)}"
        )
    sizes = config.get("cudagraph_capture_sizes")
    if isinstance(sizes, list) and not all(isinstance(size, int) and size > 0 for size in sizes):
        raise UsageError(f"--compilation-config cudagraph_capture_sizes {sizes}: each is a batch size, 1 or more")
    if mode == "NONE":
        return CompiledGraphs("NONE", (), "no CUDA graphs are captured")
    if isinstance(sizes, list) and sizes:
        # vLLM keeps the listed sizes within the token budget (VllmConfig._set_cudagraph_sizes)
        listed = tuple(sorted({size for size in sizes if isinstance(size, int) and 0 < size <= batched}))
        return CompiledGraphs(mode, listed, f"cudagraph_capture_sizes lists {len(sizes)}")
    largest = config.get("max_cudagraph_capture_size")
    if isinstance(largest, int) and largest >= 0:
        return CompiledGraphs(mode, tuple(capture_sizes(largest, interactive)), f"max_cudagraph_capture_size {largest}")
    return replace(default, mode=mode)


# vLLM's CUDAGraphMode (config/compilation.py)
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
WIDE_TOKENS = 8192  # vLLM 0.34 on data-center Blackwell: the prefill grid's and the decode tokens' default bound


def _grid(limit: int, stride_at: Callable[[int], float]) -> list[int]:
    """Sizes from 1 up to `limit`: from each size the next multiple of the largest power of two at most
    `stride_at(size)` (at least 1), and `limit` itself last."""
    sizes: list[int] = []
    size = 1
    while size < limit:
        sizes.append(size)
        stride = 1 << max(0, floor(log2(max(1.0, stride_at(size)))))
        size = (size // stride + 1) * stride
    return [*sizes, limit] if limit > 0 else []


def wide_grids(
    inputs: PlanInputs, release_: VllmRelease, batched: int, max_num_seqs: int
) -> tuple[list[int], list[int]]:
    """vLLM 0.34's CUDA graphs on data-center Blackwell where no capture size is set, else none: decode graphs by
    request count up to max_num_seqs (every count to 6, then a stride of the largest power of two at most
    0.65 n^(2/3): 64 counts at 1,024), within 8,192 decode tokens; prefill (mixed) graphs by token count up to
    min(8,192, max_num_batched_tokens): 1, 2, 4, every 8 to 64, four a doubling to 1,024, then every 256, every 512
    once 7% of the count passes 512 (54 counts at 8,192), every count to 32 with --performance-mode interactivity
    (`VllmConfig._split_cudagraph_capture_sizes`, `wide_defaults`, config/vllm.py; `decode_cudagraph_capture_grid`,
    `prefill_cudagraph_capture_grid`, `decode_cudagraph_capture_shapes`, config/compilation.py, 0.34.0). With
    speculative decoding (wider decode steps) kvops keeps the shared sizes."""
    config = _compilation(inputs.compilation_config)
    legacy = any(key in config for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"))
    blackwell = inputs.gpu is not None and inputs.gpu.id in CAPABILITY_10
    if not blackwell or not release_.version.at_least(0, 34) or legacy or inputs.speculative:
        return [], []
    decode_limit = min(max_num_seqs, batched, WIDE_TOKENS)
    requests = _grid(max_num_seqs, lambda count: 0.65 * count ** (2 / 3))
    decode = sorted({min(count, decode_limit) for count in requests[: bisect.bisect_left(requests, decode_limit) + 1]})
    prefill = _grid(min(WIDE_TOKENS, batched), lambda tokens: min(tokens, max(8, tokens / 4), 0.07 * max(tokens, 4096)))
    if inputs.performance_mode == "interactivity":
        prefill = sorted({*prefill, *(size for size in range(1, 33) if size < min(WIDE_TOKENS, batched))})
    return decode, prefill


def graph_sizes(
    inputs: PlanInputs, release_: VllmRelease, batched: int, max_num_seqs: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch sizes (tokens) the engine runs its forward at: a step of T tokens up to the largest captured size
    replays the graph of the next captured size (`CudagraphDispatcher.dispatch`, vllm/v1/cudagraph_dispatcher.py).
    The padding rows run through every layer (the model runner passes `input_ids[:num_input_tokens]`, the rows past
    the scheduled tokens holding earlier steps' ids, vllm/v1/worker/gpu_model_runner.py), so a mixture of experts
    routes them like any token. (Any step's sizes, a step of decodes alone's where they differ: 0.34 on data-center
    Blackwell, its decode grid by request count; () where they do not.) None with --enforce-eager, on the CPU build
    or with cudagraph_mode NONE; every other mode is taken to pad decode and mixed steps, as the default
    (FULL_AND_PIECEWISE) does."""
    if inputs.enforce_eager or inputs.device == "cpu":
        return (), ()
    graphs = _captured(inputs, release_, batched, max_num_seqs)
    if graphs.mode == "NONE":
        return (), ()
    decode, prefill = wide_grids(inputs, release_, batched, max_num_seqs)
    return tuple(prefill) or graphs.sizes, tuple(decode)


def _captured(inputs: PlanInputs, release_: VllmRelease, batched: int, max_num_seqs: int) -> CompiledGraphs:
    default = default_captures(inputs, release_, batched, max_num_seqs)
    graphs = compiled_graphs(inputs.compilation_config, default, batched, inputs.performance_mode == "interactivity")
    if inputs.lora is None or graphs.mode == "NONE" or not _specializes_lora(inputs.compilation_config):
        return graphs
    return replace(graphs, lora_cases=2, why=f"{graphs.why}; each twice, with and without LoRA")


def _specializes_lora(text: str | None) -> bool:
    """vLLM captures each size with no adapter active and with max_loras + 1, unless --compilation-config sets
    cudagraph_specialize_lora false (then only the latter): `CudagraphDispatcher._get_lora_cases`,
    v1/cudagraph_dispatcher.py, and `get_lora_capture_cases`, v1/worker/gpu/lora_utils.py (0.32.0-0.34.0)."""
    return _compilation(text).get("cudagraph_specialize_lora", True) is not False


def _compilation(text: str | None) -> dict:
    """--compilation-config as a JSON object, {} where it is none (`compiled_graphs` says so in one line)."""
    try:
        config = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return config if isinstance(config, dict) else {}


def _margin(inputs: PlanInputs, release_: VllmRelease, overheads: list[Term]) -> Term | None:
    """Planned on top of the estimated overheads, so that most logs of the family got at least the KV planned."""
    fit = _fit(inputs, release_)
    if not any(term.is_estimate for term in overheads) or not fit.bounded:
        return None
    return Term(
        "margin",
        fit.margin,
        "estimate",
        f"kvops' margin below the engine's predicted KV, which the capacity is sized on: with it, "
        f"{OVERHEAD_QUANTILE:.0%} of {_logs(fit)} had at least the KV this plan leaves, each predicted without "
        "its own log (err toward less KV)",
        common.CALIBRATE_HINT,
    )


def _signed(size: int) -> str:
    return f"+ {format_bytes(size)}" if size >= 0 else f"- {format_bytes(-size)}"


def _logs(fit: FamilyFit) -> str:
    if fit.borrowed:
        return f"{fit.logs} public {fit.borrowed} startup logs (their CUDA-graph estimate taken from the KV budget, as {fit.family} does)"
    where = "public vLLM startup logs" if fit.family == POOLED else f"public {fit.family} startup logs"
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
