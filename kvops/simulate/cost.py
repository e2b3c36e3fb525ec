"""A plan's model and device as the step-time model reads them: per-GPU weights, active parameters, cache reads,
and the datasheet figures (kvops/catalog/gpu_performance.json)."""

from __future__ import annotations

from kvops.dtypes import resolve_kv_dtype, serving_dtype
from kvops.gpus import gpu_performance
from kvops.model.spec import ModelSpec
from kvops.plan import Plan
from kvops.simulate.steptime import CacheRead, Coefficients, Hardware, ModelCost, StepTime, StepTimeError

STATE_KINDS = ("mamba",)


def model_cost(plan: Plan) -> ModelCost:
    """The plan's model at its tensor-parallel size: the weights the plan counts, the parameters a token passes
    through (routed experts at k of E), the LM head apart, and each cache kind's bytes per token."""
    inputs = plan.inputs
    spec, tp = inputs.spec, inputs.tp
    weights = plan.term("weights")
    weight_bytes = weights.bytes if weights is not None else 0
    experts = spec.expert_parameters
    expert_share = experts / spec.parameters if spec.parameters else 0.0
    count = spec.count
    head = (count.lm_head or count.embeddings) if count is not None else spec.vocab_size * spec.hidden_size
    embeddings = count.embeddings if count is not None else spec.vocab_size * spec.hidden_size
    untied_embeddings = embeddings if not spec.tie_word_embeddings else 0
    dense = max(spec.parameters - experts - head - untied_embeddings, 0)
    active_experts = experts * spec.experts_per_token / spec.num_experts if spec.num_experts else 0.0
    return ModelCost(
        name=spec.name,
        layers=spec.num_layers,
        hidden=spec.hidden_size,
        tp=tp,
        weight_bytes=weight_bytes,
        expert_bytes=int(weight_bytes * expert_share),
        num_experts=spec.num_experts,
        experts_per_token=spec.experts_per_token,
        dense_parameters=int(dense / tp),
        expert_parameters=int(active_experts / tp),
        head_parameters=int(head / tp),
        caches=cache_reads(plan),
        moe_layers=_moe_layers(spec),
    )


def _moe_layers(spec: ModelSpec) -> int:
    """The decoder layers with routed experts, as counted; every layer of a MoE model where no count says."""
    if spec.count is not None and spec.count.layer_experts:
        return sum(1 for experts in spec.count.layer_experts if experts)
    return spec.num_layers if spec.num_experts else 0


def cache_reads(plan: Plan) -> tuple[CacheRead, ...]:
    """Each cache kind of the model (by kind and window), its bytes per token per GPU summed over its layers."""
    inputs = plan.inputs
    spec, tp = inputs.spec, inputs.tp
    served = spec.dtype if inputs.dtype == "auto" else serving_dtype(inputs.dtype)
    dtype = resolve_kv_dtype(inputs.kv_dtype, served)
    kinds: dict[tuple[str, int | None], list] = {}
    for _, layer in spec.caches():
        window = getattr(layer, "window", None) or getattr(layer, "chunk", None) or None
        kinds.setdefault((layer.kind, window), []).append(layer)
    reads = []
    for (kind, window), layers in kinds.items():
        first = layers[0]
        per_token = sum(layer.bytes_per_token(dtype, tp) for layer in layers)
        heads = max(spec.num_attention_heads // tp, 1)
        if kind in STATE_KINDS:
            reads.append(CacheRead(0, None, len(layers), 0, 0, state_bytes=per_token))
        else:
            reads.append(CacheRead(per_token, window, len(layers), heads, _head_dim(spec, first)))
    return tuple(reads)


def _head_dim(spec: ModelSpec, layer) -> int:
    """The query/key width attention multiplies over (MLA: the latent plus the rotary part)."""
    if layer.kind == "mla":
        return int(layer.kv_lora_rank + layer.qk_rope_head_dim)
    return int(getattr(layer, "head_dim", 0) or spec.hidden_size // max(spec.num_attention_heads, 1))


def hardware(plan: Plan, flops_dtype: str) -> Hardware:
    """The plan's GPU as the datasheet gives it; StepTimeError where the catalog has no figures for it."""
    gpu = plan.inputs.gpu
    if gpu is None:
        raise StepTimeError("kvops simulate needs a GPU from the catalog (--gpu) for its step time")
    figures = gpu_performance(gpu.id)
    if figures is None or not figures.memory_bandwidth:
        raise StepTimeError(f"--gpu {gpu.id}: the catalog has no datasheet figures for its step time")
    flops = figures.peak_flops(flops_dtype)
    if not flops:
        raise StepTimeError(f"--gpu {gpu.id}: the datasheet gives no dense {flops_dtype} throughput")
    return Hardware(
        name=gpu.id,
        memory_bandwidth=float(figures.memory_bandwidth),
        flops=float(flops),
        link_bandwidth=float(figures.interconnect_bandwidth or 0.0),
        source=figures.source,
    )


def step_time(plan: Plan, coefficients: Coefficients) -> StepTime:
    """The step-time model of the plan's model on its GPU (or, for a profile fitted on one machine, that
    machine's own figures)."""
    machine = coefficients.hardware
    device = machine if machine is not None else hardware(plan, compute_dtype(plan))
    return StepTime(model_cost(plan), device, coefficients)


def compute_dtype(plan: Plan) -> str:
    """What the matrix multiplies run in: fp8 for FP8 weights, else the serving dtype (weight-only formats
    dequantize to it)."""
    from kvops.engines.weights import weight_format

    inputs = plan.inputs
    if weight_format(inputs.spec, inputs.quantization).name.startswith("fp8"):
        return "fp8"
    return inputs.spec.dtype if inputs.dtype == "auto" else serving_dtype(inputs.dtype)
