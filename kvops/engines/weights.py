"""The weights an engine loads per GPU: the checkpoint's format (dtype or quantization scheme) and its bytes, split
by tensor, pipeline and expert parallelism as the engine splits them. Every figure a `Term` that says how it was
obtained."""

from __future__ import annotations

from collections import Counter
from dataclasses import field
from math import ceil

from kvops.dtypes import KV_DTYPES, serving_dtype
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.model.checkpoint import LoadedWeights, Loading, Parallel, loaded_weights, pipeline_partition
from kvops.model.spec import ModelSpec
from kvops.plan import Term
from kvops.units import format_bytes


@frozen
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
    _check_against_checkpoint(spec, key)
    if key == "auto":
        key = str(quant.get("quant_method") or spec.dtype).lower()
        if key == "modelopt":  # NVIDIA ModelOpt names its format in quant_algo
            if str(quant.get("quant_algo")).upper() == "MIXED_PRECISION":
                return _mixed_precision(quant, spec)
            key = _modelopt_format(quant)
        if key == "bitsandbytes":
            key = (
                "bitsandbytes"
                if quant.get("load_in_8bit")
                else f"bitsandbytes-{quant.get('bnb_4bit_quant_type', 'nf4')}"
            )
    key = _SPELLINGS.get(key, key)
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
        if group < 0:  # -1: per channel, one scale and zero per output channel (a few KiB a matrix: not counted)
            return WeightFormat(
                key, bits, "linear", f"{key} int{bits}, per-channel scales (not counted); embeddings and LM head 16-bit"
            )
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
        values = "4-bit values + one 8-bit scale per 32"
        if not spec.num_experts:  # nothing to hold experts-only MXFP4: a W4A4 checkpoint (compressed-tensors, Quark)
            return WeightFormat(
                "mxfp4",
                4 + 8 / 32,
                "linear",
                f"MXFP4 linear layers (a dense model: W4A4): {values}; embeddings and LM head 16-bit",
            )
        return WeightFormat(
            "mxfp4", 4 + 8 / 32, "experts", f"MXFP4 experts: {values}; attention, router, embeddings 16-bit"
        )
    if name.lower() == "auto":
        raise UsageError(
            f"{spec.name}: its quantization_config's quant_method {key!r} is not a weight format kvops models; plan it "
            f"as one with --quantization: {', '.join(WEIGHT_FORMAT_CHOICES[1:])}"
        )
    raise UsageError(
        f"--quantization {name!r} is not a weight format kvops models; valid: {', '.join(WEIGHT_FORMAT_CHOICES)}"
    )


# quant_method spellings of one format
_SPELLINGS = {"compressed_tensors": "compressed-tensors", "autoround": "auto-round", "intel/auto-round": "auto-round"}


def _modelopt_format(quant: dict) -> str:
    """NVIDIA ModelOpt names its format in quant_algo."""
    return {"FP8": "fp8", "NVFP4": "nvfp4"}.get(str(quant.get("quant_algo")).upper(), "modelopt")


def _method_family(key: str) -> str:
    """A format's name as a quantization_config's quant_method spells it (bitsandbytes' variants are one method)."""
    key = _SPELLINGS.get(key, key)
    return "bitsandbytes" if key.startswith("bitsandbytes") else key


def _check_against_checkpoint(spec: ModelSpec, asked: str) -> None:
    """A quantized checkpoint loads in its own format: vLLM refuses a --quantization that differs from its
    quantization_config's quant_method (ModelConfig._verify_quantization), so a plan in another format would size
    weights the engine never loads. A method kvops does not know is left to --quantization to name."""
    method = str((spec.quantization or {}).get("quant_method") or "").lower()
    if method == "modelopt":
        method = _modelopt_format(spec.quantization or {})
    if asked == "auto" or not method or _method_family(method) not in map(_method_family, WEIGHT_FORMAT_CHOICES):
        return
    if _method_family(asked) != _method_family(method):
        raise UsageError(
            f"--quantization {asked}: {spec.name} is quantized as {method} (its quantization_config), and the "
            f"engine loads it so whatever is asked (vLLM refuses another --quantization); leave it out or give "
            f"{_method_family(method)}"
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


@frozen
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
    group = max(0, int(weights.get("group_size") or 0))  # -1 or none: per channel
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
