"""Engine-neutral pieces of a serving memory budget: the device total, weights, the activation peak of a forward
pass, overheads. Pure arithmetic on a ModelSpec and the plan's inputs; every figure is a `Term` that says how it
was obtained."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from math import ceil, floor

from kvops.dtypes import KV_DTYPES, serving_dtype
from kvops.errors import MissingDevice, UsageError
from kvops.gpus import gpu_catalog
from kvops.model.checkpoint import LoadedWeights, Loading, Parallel, loaded_weights, pipeline_partition
from kvops.model.spec import ModelSpec
from kvops.overheads import MIN_MARGIN_LOGS, POOLED, FamilyFit, Observation, OverheadFit
from kvops.plan import PlanInputs, Term
from kvops.profile import Profile
from kvops.units import GiB, format_bytes

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


WEIGHT_FORMAT_CHOICES = (
    "auto",
    "bf16",
    "fp16",
    "fp32",
    "fp8",
    "int8",
    "awq",
    "gptq",
    "auto-round",
    "mxfp4",
    "nvfp4",
    "compressed-tensors",
    "bitsandbytes",
    "bitsandbytes-nf4",
    "bitsandbytes-fp4",
    "eetq",
)
BNB_BLOCK = 64  # bitsandbytes 4-bit: one fp32 absmax per 64 weights (before its optional double quantization)
DEFAULT_GROUP_SIZE = 128


def weight_format(spec: ModelSpec, name: str = "auto") -> WeightFormat:
    """The weight format by name; 'auto' reads the config's quantization_config, else the checkpoint dtype."""
    key = name.lower()
    quant = spec.quantization or {}
    if key == "auto":
        key = str(quant.get("quant_method") or spec.dtype).lower()
        if key == "modelopt":  # NVIDIA ModelOpt names its format in quant_algo
            algo = str(quant.get("quant_algo")).upper()
            if algo == "MIXED_PRECISION":
                return _mixed_precision(quant, spec)
            key = {"FP8": "fp8", "NVFP4": "nvfp4"}.get(algo, key)
        if key == "bitsandbytes":
            key = (
                "bitsandbytes"
                if quant.get("load_in_8bit")
                else f"bitsandbytes-{quant.get('bnb_4bit_quant_type', 'nf4')}"
            )
    key = {"compressed_tensors": "compressed-tensors", "autoround": "auto-round", "intel/auto-round": "auto-round"}.get(
        key, key
    )
    if key == "compressed-tensors":
        return _compressed_tensors(spec, quant)
    if key == "eetq":
        return WeightFormat("eetq", 8, "linear", "EETQ int8 weights, per-channel scales; embeddings and LM head 16-bit")
    if key == "bitsandbytes":
        return WeightFormat(
            "bitsandbytes",
            8,
            "linear",
            "bitsandbytes LLM.int8 weights, per-row fp32 scales not counted; embeddings and LM head 16-bit",
        )
    if key in ("bitsandbytes-nf4", "bitsandbytes-fp4"):
        return WeightFormat(
            key,
            4 + 32 / BNB_BLOCK,
            "linear",
            f"bitsandbytes 4-bit ({key[-3:]}): one fp32 absmax per {BNB_BLOCK} (double quantization would store ~4.13 bits); embeddings and LM head 16-bit",
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
    if key in ("awq", "gptq", "auto-round"):
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


def _mixed_precision(quant: dict, spec: ModelSpec) -> WeightFormat:
    """ModelOpt MIXED_PRECISION names a format per layer. Counted so as to promise less KV cache: routed experts
    all NVFP4 -> the experts at NVFP4 and the rest 16-bit; else every quantized layer at fp8. The checkpoint's own
    bytes replace the count when its safetensors headers are read."""
    layers = quant.get("quantized_layers") or {}
    algos = Counter(str(layer.get("quant_algo")).upper() for layer in layers.values())
    mix = ", ".join(f"{count} {algo}" for algo, count in sorted(algos.items()))
    exact = "an overestimate; plan hf://ORG/NAME or a local folder for the checkpoint's own bytes"
    experts = [str(layer.get("quant_algo")).upper() for name, layer in layers.items() if name.endswith(".experts")]
    if spec.num_experts and experts and all("NVFP4" in algo for algo in experts):
        return WeightFormat(
            "nvfp4",
            4 + 8 / 16,
            "experts",
            f"ModelOpt mixed precision ({mix} layers): routed experts NVFP4 (one fp8 scale per 16), the rest counted 16-bit, {exact}",
        )
    return WeightFormat("fp8", 8, "linear", f"ModelOpt mixed precision ({mix} layers), all counted as fp8, {exact}")


@dataclass(frozen=True)
class WeightOptions:
    """What the engine loads besides the format: the parallel split and what it leaves out or converts."""

    parallel: Parallel = field(default_factory=Parallel)
    serving_dtype: str | None = None  # --dtype; None: the model's own
    text_only: bool = False  # the vision tower is not loaded (vLLM --language-model-only)
    load_mtp: bool = False  # MTP layers loaded (MTP speculative decoding)
    expert_alignment: tuple[int, int] = (1, 1)  # (hidden, intermediate per rank) the engine's MoE kernel pads to


def weight_bytes(
    spec: ModelSpec,
    fmt: WeightFormat,
    tp: int = 1,
    options: WeightOptions | None = None,
    expert_alignment: tuple[int, int] = (1, 1),
) -> Term:
    """Weights per GPU (on the pipeline stage that holds the most): the checkpoint's own bytes when its safetensors
    headers were read and it is served as stored, else the parameter count at the format's bits."""
    options = options or WeightOptions(Parallel(tp, 1, tp), expert_alignment=expert_alignment)
    return stage_weights(spec, fmt, options)[0]


def stage_weights(spec: ModelSpec, fmt: WeightFormat, options: WeightOptions) -> tuple[Term, tuple[int, ...]]:
    """The weights term of the heaviest stage, and every stage's bytes per GPU."""
    measure = "the engine logs it: 'Model loading took X GiB' (`kvops calibrate`)"
    if spec.checkpoint is not None and fmt.name == weight_format(spec).name:
        loaded = loaded_weights(spec.checkpoint, _loading(spec, options), options.parallel)
        formula = _checkpoint_formula(spec, loaded, options)
        return Term("weights", loaded.bytes, "computed", formula, measure), loaded.stage_bytes
    stages, formula = _counted_weights(spec, fmt, options)
    worst = max(stages)
    return Term("weights", worst, "computed", formula, measure), stages


def _loading(spec: ModelSpec, options: WeightOptions) -> Loading:
    return Loading(
        serving_dtype=options.serving_dtype or spec.dtype,
        text_only=options.text_only,
        load_mtp=options.load_mtp,
        tie_word_embeddings=spec.tie_word_embeddings,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        num_experts=spec.num_experts,
    )


def _checkpoint_formula(spec: ModelSpec, loaded: LoadedWeights, options: WeightOptions) -> str:
    checkpoint = spec.checkpoint
    assert checkpoint is not None
    parts = " + ".join(f"{dtype} {format_bytes(size)}" for dtype, size in loaded.by_dtype.items())
    text = (
        f"checkpoint's own bytes per GPU: {parts} ({checkpoint.source}; {format_bytes(checkpoint.stored_bytes)} stored)"
    )
    text += _split_words(spec, options.parallel, loaded.stage if options.parallel.pp > 1 else None)
    if loaded.converted:
        cast = ", ".join(f"{dtype} {format_bytes(size)}" for dtype, size in loaded.converted.items())
        text += f"; cast to {options.serving_dtype or spec.dtype}: {cast} as stored"
    if loaded.left_out:
        text += "; not loaded: " + ", ".join(
            f"{reason} {format_bytes(size)}" for reason, size in loaded.left_out.items()
        )
    return text


def _split_words(spec: ModelSpec, parallel: Parallel, stage: int | None) -> str:
    words = []
    if parallel.tp > 1:
        words.append(f"/ tp {parallel.tp} (norms and router replicated)")
    if spec.num_experts and parallel.expert_ranks > 1:
        whole = ", whole experts per rank" if parallel.whole_experts else ""
        words.append(f"routed experts / {parallel.expert_ranks} ranks{whole}")
    if stage is not None:
        words.append(f"split over {parallel.pp} pipeline stages")
    return f", {', '.join(words)}" if words else ""


def _counted_weights(spec: ModelSpec, fmt: WeightFormat, options: WeightOptions) -> tuple[tuple[int, ...], str]:
    """Each stage's weights from the parameter count: quantized weights at `fmt.bits`, the rest at the activation
    dtype; routed experts split over the expert ranks, the rest over tp. Float weights are cast to the serving dtype
    (--dtype) as the engine loads them, as the checkpoint's own bytes are (`checkpoint._as_loaded`)."""
    parallel = options.parallel
    served = _served_bytes(options)
    activation_bytes = served or 2
    params, experts = _loaded_counts(spec, options)
    if fmt.scope == "none":
        rate = served or fmt.bits / 8
        expert_bytes, rest_bytes = experts * rate, (params - experts) * rate
        formula = f"{params:,} parameters x {rate:g} B"
        if rate != fmt.bits / 8:
            formula += f" (cast to {serving_dtype(options.serving_dtype or '')} from the checkpoint's {fmt.bits} bits)"
    else:  # routed experts are quantized in both scopes
        kept = params - experts if fmt.scope == "experts" else _embedding_parameters(spec)
        quantized = params - kept
        padding = _expert_padding(spec, parallel.tp, options.expert_alignment) if fmt.scope == "experts" else 1.0
        expert_bytes = experts * padding * fmt.bits / 8
        rest_bytes = (quantized - experts) * fmt.bits / 8 + kept * activation_bytes
        formula = f"{quantized:,} quantized x {fmt.bits:g} bits + {kept:,} unquantized x {activation_bytes} B"
        if padding > 1:
            hidden, inter = options.expert_alignment
            formula += (
                f" (experts padded x {padding:.4f}: hidden to a multiple of {hidden}, intermediate per rank to {inter})"
            )
    expert_share = 1 / parallel.expert_ranks
    if parallel.whole_experts and spec.num_experts:
        expert_share = ceil(spec.num_experts / parallel.expert_ranks) / spec.num_experts
    shares = _stage_shares(spec, parallel.pp)
    stages = tuple(
        ceil(expert_bytes * expert_part * expert_share + rest_bytes * rest_part / parallel.tp)
        for rest_part, expert_part in shares
    )
    if spec.num_experts and parallel.expert_ranks != parallel.tp:
        formula += f", experts / {parallel.expert_ranks} ranks, the rest / tp {parallel.tp}"
    elif parallel.tp > 1:
        formula += f", / tp {parallel.tp}"
    if parallel.pp > 1:
        formula += f", split over {parallel.pp} pipeline stages (layers as vLLM splits them)"
    source = "catalog parameter count" if spec.parameters_source == "catalog" else "parameters counted from config.json"
    return stages, f"{formula} ({fmt.note}; {source})"


def _served_bytes(options: WeightOptions) -> int | None:
    """Bytes per float weight at the serving dtype (--dtype); None when the model's own dtype is served."""
    if not options.serving_dtype:
        return None
    dtype = KV_DTYPES.get(serving_dtype(options.serving_dtype))
    return dtype.bits // 8 if dtype is not None and dtype.name in ("bf16", "fp16", "fp32") else None


def _loaded_counts(spec: ModelSpec, options: WeightOptions) -> tuple[int, int]:
    """Parameters the engine loads, and how many of them are routed experts."""
    params = spec.parameters
    if options.text_only:
        params -= spec.vision_parameters
    if options.load_mtp:
        params += spec.mtp_parameters
    return params, spec.expert_parameters


def _stage_shares(spec: ModelSpec, pp: int) -> list[tuple[float, float]]:
    """Each pipeline stage's share of the non-expert and of the expert parameters (by the counted layers; the
    embeddings on the first stage, the LM head on the last, a tied head on both)."""
    count = spec.count
    if pp == 1 or count is None or not count.layers:
        return [(1.0, 1.0)]
    sizes = pipeline_partition(len(count.layers), pp)
    edges = [sum(sizes[:i]) for i in range(pp + 1)]
    rest_layers = [layer - experts for layer, experts in zip(count.layers, count.layer_experts)]
    head = count.lm_head or (count.embeddings if spec.tie_word_embeddings else 0)
    rest_total = sum(rest_layers) + count.embeddings + count.lm_head
    expert_total = sum(count.layer_experts) or 1
    shares = []
    for stage in range(pp):
        rest = sum(rest_layers[edges[stage] : edges[stage + 1]])
        rest += count.embeddings if stage == 0 else 0
        rest += head if stage == pp - 1 else 0
        experts = sum(count.layer_experts[edges[stage] : edges[stage + 1]])
        shares.append((rest / rest_total, experts / expert_total))
    return shares


def _expert_padding(spec: ModelSpec, tp: int, alignment: tuple[int, int]) -> float:
    """How much larger the experts are once their hidden and per-rank intermediate sizes are rounded up."""
    inter = (spec.moe_intermediate_size or spec.intermediate_size) / tp
    if not spec.num_experts or not inter:
        return 1.0
    hidden = -(-spec.hidden_size // alignment[0]) * alignment[0]
    padded = -(-ceil(inter) // alignment[1]) * alignment[1]
    return hidden * padded / (spec.hidden_size * inter)


def _embedding_parameters(spec: ModelSpec) -> int:
    """The embeddings and an untied LM head: kept at 16 bits by the quantized formats."""
    embeddings = spec.vocab_size * spec.hidden_size
    return embeddings if spec.tie_word_embeddings else 2 * embeddings


def _compressed_tensors(spec: ModelSpec, quant: dict) -> WeightFormat:
    """compressed-tensors: the weights' num_bits and group size of its first config group; one 16-bit scale per
    group (fp8 scales for NVFP4 packing), a zero point per group when asymmetric."""
    groups = [group for group in (quant.get("config_groups") or {}).values() if isinstance(group, dict)]
    weights = (groups[0].get("weights") if groups else None) or {}
    if not weights.get("num_bits"):
        raise UsageError(
            f"{spec.name}: its compressed-tensors quantization_config names no weights num_bits; pass --quantization fp8, int8, awq or gptq"
        )
    bits = int(weights["num_bits"])
    group = int(weights.get("group_size") or 0)
    nvfp4 = "nvfp4" in str(quant.get("format", "")) or (bits == 4 and weights.get("type") == "float")
    scale_bits = (8 if nvfp4 else 16) / group if group else 0
    zero_bits = bits / group if group and weights.get("symmetric") is False else 0
    kind = "fp" if weights.get("type") == "float" else "int"
    per = f", group {group}" if group else f", {weights.get('strategy', 'channel')} scales"
    return WeightFormat(
        "compressed-tensors",
        bits + scale_bits + zero_bits,
        "linear",
        f"compressed-tensors {kind}{bits}{per}; embeddings and LM head 16-bit",
    )


# --- activations ----------------------------------------------------------------------------------------


def forward_activation_peak(spec: ModelSpec, tokens: int, tp: int = 1, activation_bytes: int = 2) -> int:
    """Largest set of tensors alive at once in one layer of a forward pass over `tokens` tokens, per GPU.

    The residual stream, the layer's input and its normed copy (3 x hidden), plus the widest of: attention (q, k, v
    and its output) or the MLP (gate+up and the activated half; for MoE the top-k experts' share). Checked on V0
    startup logs, whose profile peaks in the forward pass at long contexts: Llama-3.1-8B at 20000 and 29000
    batched tokens logged 2.07 and 2.99 GiB, this model gives 2.06 and 2.99 (tests/fixtures/corpus).
    """
    heads = spec.num_attention_heads / tp
    kv_heads = max(1, spec.num_kv_heads // tp)
    attention = 2 * heads * spec.head_dim + 2 * kv_heads * spec.head_dim
    if spec.num_experts:
        inter = spec.moe_intermediate_size or spec.intermediate_size
        mlp = max(1, spec.experts_per_token) * 3 * inter / tp + spec.num_experts
    else:
        mlp = 3 * spec.intermediate_size / tp
    width = 3 * spec.hidden_size + max(attention, mlp)
    return ceil(tokens * width * activation_bytes)


def sampler_logits(spec: ModelSpec, sequences: int) -> int:
    """Logits of one decode step for `sequences` sequences: every rank samples over the whole vocabulary."""
    return sequences * spec.vocab_size


def sampler_peak(spec: ModelSpec, sequences: int, bytes_per_logit: float) -> int:
    """The sampler's peak over one step's logits, at a release's bytes per logit (the logits, their fp32 copy and
    probabilities, and a full-vocabulary sort's values and indices where the release sorts)."""
    return ceil(sampler_logits(spec, sequences) * bytes_per_logit)


# --- overheads fitted on the corpus of public engine logs ------------------------------------------------

# The fit itself (offline: tests and `python bench/accuracy.py --refit`); the values it makes, and the one kvops ships,
# are in kvops.overheads.
OVERHEAD_QUANTILE = 0.9  # the planned KV is below what this share of the family's logs got
MIN_FAMILY_LOGS = 3  # fewer logs than this and a family plans with the fit of the family it falls back to
MIN_SAMPLER_LOGS = 2  # logs whose profile peaked in the sampler, to fit a family's bytes per logit
SAMPLER_PEAK_SHARE = 0.8  # a log whose forward model is below this share of its activation peaked in the sampler


def fit_overheads(
    engine: str,
    observations: list[Observation],
    families: tuple[str, ...],
    fallbacks: dict[str, str] | None = None,
    graph_families: tuple[str, ...] = (),
    sampler_fallbacks: dict[str, str] | None = None,
) -> OverheadFit:
    """Each family's terms from its logs; a family with too few plans with the one it falls back to (the nearest
    release that shares its engine and memory profile), else with the pooled fit. The sampler's bytes per logit
    fall back apart, to the nearest family whose profile samples the same way (`sampler_fallbacks`: a sorting
    sampler borrows a sorting one's). A family in `graph_families` (its release takes the CUDA-graph estimate from
    the KV budget) with too few logs of its own borrows its fallback's logs that print that estimate, as if it had
    been applied: the same arithmetic, so its margin and band carry the estimate's spread. Families are fitted after
    the ones they fall back to. The margin and the spread come from every log's leave-one-out residual (each
    predicted by its family's fit without it): the family's own when it has enough, else pooled over the families.
    Logs whose budget arithmetic cannot be the launch's are left out, and listed."""
    fallbacks = fallbacks or {}
    sampler_fallbacks = sampler_fallbacks or {}
    excluded = tuple(sorted((item.source, why) for item in observations if (why := item.implausible)))
    kept = [item for item in observations if item.implausible is None]
    pooled = _fit_terms(POOLED, kept, None)
    groups = {family: [item for item in kept if item.family == family] for family in families}
    borrowed: dict[str, str] = {}
    for family in graph_families:
        own, fallback = groups.get(family, []), fallbacks.get(family)
        if len(own) < MIN_FAMILY_LOGS and fallback:
            borrowed[family] = fallback
            groups[family] = own + [
                replace(item, family=family, cuda_graphs_applied=True)
                for item in groups.get(fallback, [])
                if item.cuda_graphs and item.activation is not None and item.non_torch is not None
            ]
    fits: dict[str, FamilyFit] = {POOLED: pooled}

    def base(family: str) -> FamilyFit:
        fallback = fallbacks.get(family)
        if fallback is None:
            return pooled
        return fits.get(fallback) or base(fallback)

    def sampler_base(family: str) -> FamilyFit | None:
        fallback = sampler_fallbacks.get(family)
        return fits.get(fallback) if fallback else None

    order = sorted(families, key=lambda name: (_depth(name, fallbacks), _depth(name, sampler_fallbacks)))
    for family in order:
        if len(groups[family]) >= MIN_FAMILY_LOGS:
            fitted = _fit_terms(family, groups[family], base(family), sampler_base(family))
            fits[family] = replace(fitted, borrowed=borrowed.get(family, ""))
    residuals = {family: _residuals(own, base(family), sampler_base(family)) for family, own in groups.items()}
    every = [value for own in residuals.values() for value in own]
    for name, fit in list(fits.items()):
        family_residuals = residuals.get(name, [])
        chosen = family_residuals if len(family_residuals) >= MIN_MARGIN_LOGS else every
        if chosen:
            margin = max(0, _quantile(chosen, OVERHEAD_QUANTILE))
            spread = (max(0, max(chosen) - margin), max(0, margin - min(chosen)))
            fits[name] = replace(fit, margin=margin, spread=spread, residuals=len(chosen))
    ordered = {name: fits[name] for name in (POOLED, *families) if name in fits}
    return OverheadFit(
        engine,
        ordered,
        tuple(sorted(item.source for item in kept)),
        excluded,
        tuple(sorted(fallbacks.items())),
        tuple(sorted(sampler_fallbacks.items())),
    )


def _depth(family: str, fallbacks: dict[str, str]) -> int:
    """How many families this one falls back through (fitted after them)."""
    return 0 if family not in fallbacks else 1 + _depth(fallbacks[family], fallbacks)


def _residuals(observations: list[Observation], base: FamilyFit, sampler: FamilyFit | None = None) -> list[int]:
    """Each log's total overhead less what its family's fit without it predicts (positive: kvops said too little)."""
    out = []
    for index, held in enumerate(observations):
        if held.total is None:
            continue
        rest = observations[:index] + observations[index + 1 :]
        if len(rest) >= MIN_FAMILY_LOGS:
            fit = _fit_terms(held.family, rest, base, sampler)
        else:
            fit = replace(base, sampler_bytes_per_logit=sampler.sampler_bytes_per_logit) if sampler else base
        out.append(held.total - fit.total(held))
    return out


def _fit_terms(
    family: str, observations: list[Observation], base: FamilyFit | None, sampler_base: FamilyFit | None = None
) -> FamilyFit:
    non_torch_all = [item.non_torch for item in observations if item.non_torch is not None]
    default_non_torch = base.non_torch if base else (NON_TORCH_TP1, NON_TORCH_TP)

    def non_torch(multi: bool, default: int) -> int:
        found = [
            item.non_torch
            for item in observations
            if item.non_torch is not None and (item.tp > 1) == multi and (not multi or item.custom_all_reduce)
        ]
        return _median(found) if found else (_median(non_torch_all) if non_torch_all else default)

    nt = (non_torch(False, default_non_torch[0]), non_torch(True, default_non_torch[1]))
    without = [
        item.non_torch
        for item in observations
        if item.non_torch is not None and item.tp > 1 and not item.custom_all_reduce
    ]
    nccl = _median(without) if without else (base.non_torch_nccl if base else None)
    default_graphs = base.cuda_graphs if base else (0, 0)

    def graphs(multi: bool, default: int) -> int:
        found = [item.cuda_graphs for item in observations if item.cuda_graphs and (item.tp > 1) == multi]
        every = [item.cuda_graphs for item in observations if item.cuda_graphs]
        return _median(found) if found else (_median(every) if every else default)

    cuda_graphs = (graphs(False, default_graphs[0]), graphs(True, default_graphs[1]))
    peaks = [
        (item, peak) for item in observations if (peak := _activation_seen(item, nt, cuda_graphs, nccl)) is not None
    ]
    per_logit = [
        (peak - item.persistent) / item.logits
        for item, peak in peaks
        if item.logits and item.forward < SAMPLER_PEAK_SHARE * peak
    ]
    if len(per_logit) >= MIN_SAMPLER_LOGS:
        import statistics

        bytes_per_logit = statistics.median(per_logit)
    else:
        borrowed = sampler_base or base
        bytes_per_logit = borrowed.sampler_bytes_per_logit if borrowed else 0.0
    sampler = FamilyFit(family, 0, bytes_per_logit, nt, cuda_graphs, 0, (0, 0), 0, non_torch_nccl=nccl)
    excess = [peak - sampler.activation(item.forward, item.logits, item.persistent) for item, peak in peaks]
    extra = _median(excess) if excess else (base.activation_excess if base else 0)
    return replace(sampler, activation_excess=extra, logs=len(observations))


def _activation_seen(
    item: Observation, non_torch: tuple[int, int], cuda_graphs: tuple[int, int], nccl: int | None = None
) -> int | None:
    """The activation peak a log measured, or read from its overhead sum less the fitted non-torch and graphs."""
    if item.activation is not None:
        return item.activation
    if item.overhead is None:
        return None
    graphs = (item.cuda_graphs or cuda_graphs[0 if item.tp == 1 else 1]) if item.cuda_graphs_applied else 0
    spent = (
        non_torch[0] if item.tp == 1 else (nccl if not item.custom_all_reduce and nccl is not None else non_torch[1])
    )
    return item.overhead - spent - graphs


def _median(values: list[int]) -> int:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2


def _quantile(values: list[int], share: float) -> int:
    """Nearest-rank quantile: the smallest value at least `share` of the values are at or below."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, ceil(share * len(ordered)) - 1))]


# Before any log: non-torch memory of one process (CUDA/cuBLAS workspaces, attention buffers) and, at tp >= 2, NCCL
# and custom all-reduce buffers too: 0.35 GiB (RTX 3090, tp 1, vllm-project/vllm#10517) to 0.20 GiB per rank
# (RTX 3090, vllm-project/vllm PR #14447) in V0 logs.
NON_TORCH_TP1 = 512 * MiB
NON_TORCH_TP = 1 * GiB


# --- the device total as the engine sees it ----------------------------------------------------------------


@dataclass(frozen=True)
class EngineTotal:
    """A GPU's total as torch reports it to the engine (kvops/catalog/device_totals.json): the bytes measured on the
    GPU where kvops has them, else a public engine log's GiB with the log's own decimals."""

    bytes: int
    printed: str
    source: str


@lru_cache(maxsize=1)
def _device_totals() -> tuple[dict[str, EngineTotal], float]:
    import json

    from kvops.packaged import packaged_text

    data = json.loads(packaged_text("kvops.catalog", "device_totals.json"))
    totals = {
        gpu_id: EngineTotal(item.get("bytes") or round(float(item["gib"]) * GiB), item["printed"], item["source"])
        for gpu_id, item in data["devices"].items()
    }
    reserved = [1 - totals[gpu.id].bytes / gpu.memory_bytes for gpu in gpu_catalog() if gpu.id in totals]
    return totals, max(reserved)


def engine_total(gpu_id: str) -> EngineTotal | None:
    return _device_totals()[0].get(gpu_id)


def largest_reserved_fraction() -> float:
    """The largest share of nvidia-smi's total the driver keeps from torch, among GPUs whose both totals are known."""
    return _device_totals()[1]


def device_total(inputs: PlanInputs) -> int:
    """Bytes per device as the engine sees them: what it measured (a profile), else the table, else an estimate."""
    return device_total_term(inputs).bytes


def device_total_term(inputs: PlanInputs) -> Term:
    """The device total: a profile's measured one when it ran on the plan's GPU, else the GPU's engine-side total."""
    profile = inputs.profile
    same_gpu = profile is not None and (profile.gpu is None or inputs.gpu is None or profile.gpu == inputs.gpu.id)
    if profile and profile.total_memory_bytes and same_gpu:
        return Term(
            "total",
            profile.total_memory_bytes,
            "measured",
            f"device total the engine measured (profile {profile.source})",
        )
    gpu = inputs.gpu
    if gpu is None:
        raise MissingDevice("missing --gpu NAME or --gpu-memory SIZE")
    if gpu.reported_by == "--gpu-memory":
        return Term("total", gpu.memory_bytes, "input", f"{gpu.source}: taken as the total the engine sees")
    if gpu.vendor == "amd":
        return Term(
            "total",
            gpu.memory_bytes,
            "input",
            f"{gpu.id}: {gpu.memory_mib:g} MiB as {gpu.reported_by} reports it, the total torch sees on ROCm ({gpu.source})",
        )
    seen = engine_total(gpu.id)
    if seen is not None:
        return Term(
            "total",
            seen.bytes,
            "input",
            f"{gpu.id}: {seen.bytes / GiB:.2f} GiB as torch reports it to the engine ('{seen.printed}', {seen.source}); "
            f"{gpu.reported_by} shows {gpu.memory_mib:g} MiB",
        )
    reserved = largest_reserved_fraction()
    return Term(
        "total",
        floor(gpu.memory_bytes * (1 - reserved)),
        "estimate",
        f"{gpu.id}: {gpu.memory_mib:g} MiB as {gpu.reported_by} reports it, less {reserved:.2%} the driver keeps "
        "(the largest share seen among GPUs whose engine-side total is known)",
        CALIBRATE_HINT,
    )


# --- profiles from another run ----------------------------------------------------------------------------


def profile_mismatch(inputs: PlanInputs, version: str, label: str) -> list[str]:
    """A profile measured on another model, GPU or engine release than the plan's: its figures may not apply."""
    profile = inputs.profile
    assert profile is not None
    out = []
    if model_measurements(inputs) is None:
        out.append(
            f"--profile was measured on model {profile.model}, not {inputs.spec.name}: its weights and activation "
            "are not used (computed for this model); its device figures are"
        )
    if profile.gpu and inputs.gpu and profile.gpu != inputs.gpu.id:
        out.append(
            f"--profile was measured on {profile.gpu}, the plan is for {inputs.gpu.id}: its device total and overheads may not apply"
        )
    if profile.engine_version and profile.engine_version.removesuffix("-v0") != version:
        out.append(
            f"--profile was measured on {profile.engine} {profile.engine_version}, the plan follows {label}: "
            f"give --engine-version {profile.engine_version} to plan that release"
        )
    return out


def model_measurements(inputs: PlanInputs) -> Profile | None:
    """The profile whose model-dependent figures (weights, activation, overheads) this plan may use: one measured
    on this model (or naming none). A profile from another model would put its weights in this model's place."""
    profile = inputs.profile
    if profile is None or (profile.model and not same_model(profile.model, inputs.spec)):
        return None
    return profile


def same_model(name: str, spec: ModelSpec) -> bool:
    """A profile's model is this one: the same id or path, or the same last path segment (a local copy)."""
    return (
        name in (spec.name, spec.source_path) or name.rstrip("/").split("/")[-1] == spec.name.rstrip("/").split("/")[-1]
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
