"""Engine-neutral pieces of a serving memory budget: the device total, weights, the activation peak of a forward
pass, overheads. Pure arithmetic on a ModelSpec and the plan's inputs; every figure is a `Term` that says how it
was obtained."""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from kvops.errors import MissingDevice, UsageError
from kvops.model.spec import ModelSpec
from kvops.plan import PlanInputs, Term
from kvops.units import format_bytes

GiB = 1 << 30
MiB = 1 << 20

QUALITY_WARNING = "quantized KV costs quality on long generations: evaluate it on your own traffic before serving"

CALIBRATE_HINT = "replace with measurements: run the engine once, `kvops calibrate --vllm-log LOG --save PROFILE`, then plan with --profile PROFILE"


# --- weights --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint's weights are stored: bits per quantized weight (scales included) and what is quantized."""

    name: str
    bits: float  # per quantized weight, scales and zero points included
    scope: str  # "none" (nothing quantized), "linear" (all but embeddings and LM head), "experts" (MoE experts only)
    note: str


WEIGHT_FORMAT_CHOICES = ("auto", "bf16", "fp16", "fp32", "fp8", "int8", "awq", "gptq", "mxfp4", "nvfp4")
DEFAULT_GROUP_SIZE = 128


def weight_format(spec: ModelSpec, name: str = "auto") -> WeightFormat:
    """The weight format by name; 'auto' reads the config's quantization_config, else the checkpoint dtype."""
    key = name.lower()
    quant = spec.quantization or {}
    if key == "auto":
        key = str(quant.get("quant_method") or spec.dtype).lower()
        if key == "modelopt":  # NVIDIA ModelOpt names its format in quant_algo
            key = {"FP8": "fp8", "NVFP4": "nvfp4"}.get(str(quant.get("quant_algo")).upper(), key)
        if key in ("compressed-tensors", "compressed_tensors"):
            raise UsageError(
                f"{spec.name}: compressed-tensors checkpoints are not modelled; pass --quantization fp8, int8, awq or gptq"
            )
    if key in ("bf16", "fp16", "bfloat16", "float16"):
        return WeightFormat(
            key if key in ("bf16", "fp16") else ("bf16" if key == "bfloat16" else "fp16"), 16, "none", "16-bit weights"
        )
    if key == "fp32":
        return WeightFormat("fp32", 32, "none", "32-bit weights")
    if key == "fp8":
        block = quant.get("weight_block_size")
        if block:
            scale_bits = 32 / (block[0] * block[1])
            return WeightFormat(
                "fp8",
                8 + scale_bits,
                "linear",
                f"fp8 weights, one fp32 scale per {block[0]}x{block[1]} block; embeddings and LM head 16-bit",
            )
        return WeightFormat("fp8", 8, "linear", "fp8 weights, per-tensor scales; embeddings and LM head 16-bit")
    if key == "int8":
        return WeightFormat(
            "int8", 8, "linear", "int8 weights (w8a8), per-channel scales not counted; embeddings and LM head 16-bit"
        )
    if key in ("awq", "gptq"):
        bits = int(quant.get("bits") or quant.get("w_bit") or 4)
        group = int(quant.get("group_size") or quant.get("q_group_size") or DEFAULT_GROUP_SIZE)
        per_weight = bits + (16 + bits) / group  # one fp16 scale and one packed zero point per group
        return WeightFormat(
            key,
            per_weight,
            "linear",
            f"{key} int{bits}, group {group}: one fp16 scale + one int{bits} zero per group; embeddings and LM head 16-bit",
        )
    if key == "nvfp4":
        group = int(quant.get("group_size") or 16)
        return WeightFormat(
            "nvfp4",
            4 + 8 / group,
            "linear",
            f"NVFP4 weights: 4-bit values + one fp8 scale per {group}; embeddings and LM head 16-bit",
        )
    if key == "mxfp4":
        return WeightFormat(
            "mxfp4",
            4 + 8 / 32,
            "experts",
            "MXFP4 experts: 4-bit values + one 8-bit scale per 32; attention, router, embeddings 16-bit",
        )
    raise UsageError(
        f"--quantization {name!r} is not a weight format kvops models; valid: {', '.join(WEIGHT_FORMAT_CHOICES)}"
    )


def weight_bytes(spec: ModelSpec, fmt: WeightFormat, tp: int = 1, activation_bytes: int = 2) -> Term:
    """Weights per GPU: quantized weights at `fmt.bits`, the rest at the activation dtype, split over tp ranks."""
    params = spec.parameters
    if fmt.scope == "none":
        total = ceil(params * fmt.bits / 8)
        formula = f"{params:,} parameters x {fmt.bits / 8:g} B"
    else:
        kept = _unquantized_parameters(spec, fmt)
        quantized = params - kept
        total = ceil(quantized * fmt.bits / 8) + kept * activation_bytes
        formula = f"{quantized:,} quantized x {fmt.bits:g} bits + {kept:,} unquantized x {activation_bytes} B"
    per_gpu = ceil(total / tp)
    if tp > 1:
        formula += f", / tp {tp}"
    source = "catalog parameter count" if spec.parameters_source == "catalog" else "parameters counted from config.json"
    return Term(
        "weights",
        per_gpu,
        "computed",
        f"{formula} ({fmt.note}; {source})",
        "the engine logs it: 'Model loading took X GiB' (`kvops calibrate`)",
    )


def _unquantized_parameters(spec: ModelSpec, fmt: WeightFormat) -> int:
    if fmt.scope == "experts":
        return spec.parameters - spec.expert_parameters
    embeddings = spec.vocab_size * spec.hidden_size
    return embeddings if spec.tie_word_embeddings else 2 * embeddings


# --- activations ----------------------------------------------------------------------------------------

SAMPLER_BYTES_PER_LOGIT = 2 + 2 * 4  # the LM head's 16-bit logits, then fp32 logits and probabilities


def forward_activation_peak(spec: ModelSpec, tokens: int, tp: int = 1, activation_bytes: int = 2) -> int:
    """Largest set of tensors alive at once in one layer of a forward pass over `tokens` tokens, per GPU.

    Residual stream and layer input (2 x hidden), plus the widest of: attention (q, k, v and its output) or the
    MLP (gate+up and the activated half; for MoE the top-k experts' share).
    """
    heads = spec.num_attention_heads / tp
    kv_heads = max(1, spec.num_kv_heads // tp)
    attention = 2 * heads * spec.head_dim + 2 * kv_heads * spec.head_dim
    if spec.num_experts:
        inter = spec.moe_intermediate_size or spec.intermediate_size
        mlp = max(1, spec.experts_per_token) * 3 * inter / tp + spec.num_experts
    else:
        mlp = 3 * spec.intermediate_size / tp
    width = 2 * spec.hidden_size + max(attention, mlp)
    return ceil(tokens * width * activation_bytes)


def sampler_peak(spec: ModelSpec, sequences: int) -> int:
    """Logits of one decode step for `sequences` sequences: 16-bit from the LM head, then fp32 logits and probabilities."""
    return sequences * spec.vocab_size * SAMPLER_BYTES_PER_LOGIT


# --- overheads (estimates until measured) ---------------------------------------------------------------

# Memory a serving process holds outside PyTorch's allocator after startup (cuBLAS/cuDNN workspaces, attention
# backend buffers, NCCL and custom all-reduce buffers when tp >= 2). Public vLLM logs: 0.35 GiB (RTX 3090, tp 1,
# vllm-project/vllm#10517), 0.20 GiB per rank (RTX 4090, tp 4, vllm-project/vllm#14447). kvops budgets more.
NON_TORCH_ESTIMATE = {1: 512 * MiB}
NON_TORCH_ESTIMATE_TP = 1 * GiB

# CUDA graphs captured for decode batch sizes. vLLM >= 0.21 profiles this before sizing KV; public logs show
# 0.17 GiB (TP4, noonghunna/club-3090#127) to 0.5 GiB (TP2, util 0.8800 -> 0.8592 on 24 GiB, club-3090#104).
CUDA_GRAPH_ESTIMATE = 512 * MiB


def non_torch_estimate(tp: int) -> int:
    return NON_TORCH_ESTIMATE.get(tp, NON_TORCH_ESTIMATE_TP)


# --- the device total ------------------------------------------------------------------------------------


def device_total(inputs: PlanInputs) -> int:
    """Bytes per device: what the engine measured (a profile), else the catalog's or the user's figure."""
    if inputs.profile and inputs.profile.total_memory_bytes:
        return inputs.profile.total_memory_bytes
    if inputs.gpu is None:
        raise MissingDevice("missing --gpu NAME or --gpu-memory SIZE")
    return inputs.gpu.memory_bytes


def device_total_term(inputs: PlanInputs) -> Term:
    if inputs.profile and inputs.profile.total_memory_bytes:
        return Term(
            "total",
            inputs.profile.total_memory_bytes,
            "measured",
            f"device total the engine measured (profile {inputs.profile.source})",
        )
    gpu = inputs.gpu
    if gpu is None:
        raise MissingDevice("missing --gpu NAME or --gpu-memory SIZE")
    return Term(
        "total",
        gpu.memory_bytes,
        "input",
        f"{gpu.id}: {gpu.memory_mib:g} MiB as {gpu.reported_by} reports it ({gpu.source})",
    )


OVERHEAD_TERMS = ("activation", "non_torch", "cuda_graphs", "overhead")


def what_does_not_fit(terms: dict[str, int], have: int) -> str:
    """The terms that leave no KV, named: the weights alone when they exceed the budget, else weights and overheads."""
    weights = terms.get("weights", 0)
    if weights > have:
        return f"the weights alone ({format_bytes(weights)}) exceed the budget: weights and overheads"
    overheads = ", ".join(f"{name} {format_bytes(terms[name])}" for name in OVERHEAD_TERMS if terms.get(name))
    return f"weights ({format_bytes(weights)}) and overheads ({overheads})"


def paging_note(num_blocks: int, block_size: int, kv_bytes: int | None, groups: int = 1) -> str:
    """What paging does and does not do to the pool at hand: it ends fragmentation, not the total."""
    per_group = " per KV cache group" if groups > 1 else ""
    size = f" in {format_bytes(max(kv_bytes, 0))}" if kv_bytes is not None else ""
    return (
        f"paged KV (PagedAttention) removes fragmentation, not the limit: the pool still holds {num_blocks:,} blocks x "
        f"{block_size} tokens = {num_blocks * block_size:,} token slots{per_group}{size}, and every cached token takes one"
    )


def model_limit(spec: ModelSpec) -> int:
    """The longest context the model was trained for: the default max-model-len."""
    if spec.max_position_embeddings:
        return spec.max_position_embeddings
    raise UsageError(f"{spec.name} has no max_position_embeddings: give --max-model-len N")
