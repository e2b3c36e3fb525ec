"""Hugging Face config.json -> ModelSpec, getting right what KV calculators commonly get wrong.

- an explicit head_dim that is not hidden_size / num_attention_heads (Qwen3, Gemma, gpt-oss);
- no num_key_value_heads at all: multi-head attention, Hkv = num_attention_heads (OPT, Llama-2-7b);
- the language model nested under text_config (Gemma 3 and other multimodal configs);
- a sliding_window that does not apply: use_sliding_window false (Qwen2.5) or null (Mistral v0.3);
- interleaved sliding/full layers, from layer_types or a sliding-window pattern (Gemma 2 and 3, gpt-oss);
- a sliding window on every layer (Mistral v0.1, Phi-3-mini);
- MLA (DeepSeek V2/V3): one latent of kv_lora_rank + qk_rope_head_dim values per token per layer;
- fields left out because the architecture's defaults supply them (Gemma 3's head_dim 256), see defaults.py.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from kvops.dtypes import canonical_dtype_name
from kvops.errors import ConfigError
from kvops.model.defaults import with_defaults
from kvops.model.fields import check_config
from kvops.model.params import PublishedCount, count_parameters, merge_kernel, vocabulary
from kvops.model.spec import (
    CacheKind,
    ChunkedLocal,
    EncoderShape,
    FullAttention,
    LayerKind,
    Mamba1State,
    MambaState,
    ModelSpec,
    MultiLatentAttention,
    NoCache,
    ParameterCount,
    ShortConvState,
    SlidingWindow,
    SparseIndexer,
    StateKind,
)

# Architectures whose cache kvops cannot compute yet: one line instead of a wrong number.
# what a refusal says to do instead
MEASURE_IT = "plan it with a measured --profile or --kv-cache-memory-bytes"
_MAMBA_ONLY = (
    "attention-free Mamba models (no KV cache: one recurrent state per sequence) are not modelled by kvops yet; "
    + MEASURE_IT
)
NOT_MODELLED = {
    **dict.fromkeys(("mamba", "falcon_mamba", "mamba2"), _MAMBA_ONLY),
    "zamba2": "Zamba2's layers (a Mamba-2 state in every layer, a shared attention block of attention_head_dim on the hybrid_layer_ids) are not modelled by kvops yet; "
    + MEASURE_IT,
    "longcat_flash": "LongCat-Flash's blocks (two MLA attentions each, 2 x num_layers caches, zero-computation experts) are not modelled by kvops yet; "
    + MEASURE_IT,
    **dict.fromkeys(
        ("bailing_hybrid", "bailing_moe_linear"),
        "Ling 2.5+/Ring-linear's hybrid layers (MLA beside lightning linear-attention or Kimi Delta Attention states, "
        "by layer_group_size) are not modelled by kvops yet; " + MEASURE_IT,
    ),
    "dory": "Dory's layers (no attention in its 'mlp' layers, a KV cache per loop of its recurrent layers) are not modelled by kvops yet; "
    + MEASURE_IT,
    "zaya": "ZAYA1's layers (attention beside a compressed-convolution state in every layer) are not modelled by kvops yet; "
    + MEASURE_IT,
    "deepseek_v4": "DeepSeek-V4's compressed sparse attention (compressed, sliding and indexer caches per layer) is not modelled by kvops yet; "
    + MEASURE_IT,
}

# DomynEdge (vLLM 0.33+ domyn_edge.py): each layer's head_dim in per_layer_config, its window in window_sizes
PER_LAYER_ATTENTION = (
    "per-layer attention shapes (per_layer_config head dims, window_sizes windows: DomynEdge) are not modelled by "
    "kvops yet; " + MEASURE_IT
)

# Field names differ between architectures; the first one present wins.
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
# num_attention_groups: StepFun's Step3 / Step-3.5 (vllm/transformers_utils/configs/step3_vl.py, step3p5.py)
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "num_attention_groups")
_INTERMEDIATE = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")


def language_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's fields: a nested text_config wins over the wrapper's own keys."""
    text = config.get("text_config")
    if isinstance(text, dict) and not _first(config, _LAYERS):
        merged = {key: value for key, value in config.items() if key != "text_config"}
        merged.update({key: value for key, value in text.items() if value is not None or key not in merged})
        return merged
    return config


def _unnested(text: dict[str, Any]) -> dict[str, Any]:
    """Fields some architectures nest, under the top-level names kvops reads (DBRX, Step-3.5)."""
    return _lfm2_layer_types(
        _step3p5_sliding(_hunyuan_experts(_ernie_experts(_step3_experts(_kimi_linear_experts(_dbrx(text))))))
    )


def _kimi_linear_experts(text: dict[str, Any]) -> dict[str, Any]:
    """Kimi Linear's experts under its own names (vllm/transformers_utils/configs/kimi_linear.py KimiLinearConfig:
    num_experts_per_token, num_shared_experts; its router keeps a correction bias, topk_method noaux_tc by
    default)."""
    if text.get("model_type") != "kimi_linear":
        return text
    named = {
        "num_experts_per_tok": text.get("num_experts_per_token"),
        "n_shared_experts": text.get("num_shared_experts"),
        "topk_method": "noaux_tc",
    }
    return {**{key: value for key, value in named.items() if value is not None}, **text}


def _one_width(text: dict[str, Any], where: str) -> dict[str, Any]:
    """An intermediate_size listed per layer (Gemma 3n: vllm/model_executor/models/gemma3n.py reads
    intermediate_size[layer_idx]) as the one width every layer has; widths that differ are not modelled."""
    widths = text.get("intermediate_size")
    if not isinstance(widths, list):
        return text
    if len(set(widths)) != 1:
        raise ConfigError(
            f"{where}: 'intermediate_size' is a list of widths that are not all the same; kvops counts one MLP width "
            f"for every layer: {MEASURE_IT}"
        )
    return {**text, "intermediate_size": widths[0]}


def _hunyuan_experts(text: dict[str, Any]) -> dict[str, Any]:
    """Hunyuan MoE, which vLLM runs on transformers' modeling_hunyuan_v1_moe.py: experts and the one shared MLP
    (use_mixed_mlp_moe) are intermediate_size wide (the config's per-layer moe_intermediate_size is not read),
    moe_topk experts a token (an int, or one a layer)."""
    if text.get("model_type") != "hunyuan_v1_moe":
        return text
    top_k = text.get("moe_topk")
    named = {
        "num_experts_per_tok": top_k[0] if isinstance(top_k, list) and top_k else top_k,
        "n_shared_experts": 1 if text.get("use_mixed_mlp_moe") else 0,
    }
    unread = {key: value for key, value in text.items() if key != "moe_intermediate_size"}
    return {**{key: value for key, value in named.items() if isinstance(value, int)}, **unread}


def _ernie_experts(text: dict[str, Any]) -> dict[str, Any]:
    """ERNIE 4.5 MoE's experts under its own names (vllm/model_executor/models/ernie45_moe.py): moe_num_experts
    of moe_k, moe_num_shared_experts beside them, in the layers from moe_layer_start_index to
    moe_layer_end_index whose index + 1 is a multiple of moe_layer_interval; the others dense."""
    if text.get("model_type") != "ernie4_5_moe" or not isinstance(text.get("moe_num_experts"), int):
        return text
    layers = int(_first(text, _LAYERS) or 0)
    start, end = int(text.get("moe_layer_start_index") or 0), text.get("moe_layer_end_index")
    end, interval = layers - 1 if end is None else int(end), int(text.get("moe_layer_interval") or 1)
    named = {
        "num_local_experts": text["moe_num_experts"],
        "num_experts_per_tok": text.get("moe_k"),
        "n_shared_experts": text.get("moe_num_shared_experts"),
        "mlp_only_layers": [i for i in range(layers) if not (start <= i <= end and (i + 1) % interval == 0)],
    }
    return {**{key: value for key, value in named.items() if value is not None}, **text}


def _step3_experts(text: dict[str, Any]) -> dict[str, Any]:
    """Step3's experts under its own names (vllm/model_executor/models/step3_text.py): moe_num_experts of
    moe_top_k in the layers moe_layers_enum lists (all but the first where it lists none), the others dense."""
    if text.get("model_type") not in ("step3_text", "step3p5") or not isinstance(text.get("moe_num_experts"), int):
        return text
    layers = _first(text, _LAYERS)
    listed = str(text.get("moe_layers_enum") or "").strip()
    moe = {int(index) for index in listed.split(",")} if listed else set(range(1, int(layers or 0)))
    named = {
        "num_local_experts": text["moe_num_experts"],
        "num_experts_per_tok": text.get("moe_top_k"),
        "mlp_only_layers": [index for index in range(int(layers or 0)) if index not in moe],
    }
    return {**{key: value for key, value in named.items() if value is not None}, **text}


def _lfm2_layer_types(text: dict[str, Any]) -> dict[str, Any]:
    """LFM2 configs may list their attention layers in full_attn_idxs alone; transformers' Lfm2Config makes the
    others short-convolution layers ("conv"), and vLLM's lfm2.py reads the layer_types it derives."""
    indices = text.get("full_attn_idxs")
    if "layer_types" in text or not isinstance(indices, list) or not isinstance(_first(text, _LAYERS), int):
        return text
    kinds = ["full_attention" if index in indices else "conv" for index in range(_first(text, _LAYERS))]
    return {**text, "layer_types": kinds}


def _step3p5_sliding(text: dict[str, Any]) -> dict[str, Any]:
    """Step-3.5 gives the layers of attention_other_setting's attention_type their own heads and head_dim
    (vllm/model_executor/models/step3p5.py Step3p5DecoderLayer): its sliding layers', as the swa_* fields."""
    other = text.get("attention_other_setting")
    if not isinstance(other, dict) or other.get("attention_type") != "sliding_attention":
        return text
    named = {
        "swa_num_key_value_heads": other.get("num_attention_groups"),
        "swa_head_dim": other.get("head_dim"),
        "swa_num_attention_heads": other.get("num_attention_heads"),
    }
    return {**{key: value for key, value in named.items() if isinstance(value, int)}, **text}


def _dbrx(text: dict[str, Any]) -> dict[str, Any]:
    """DBRX keeps its KV heads and experts in attn_config and ffn_config (transformers' DbrxConfig; vLLM's
    DbrxModelArchConfigConvertor and dbrx.py read them there): given the top-level names kvops reads."""
    attention, ffn = text.get("attn_config"), text.get("ffn_config")
    if text.get("model_type") != "dbrx" or not isinstance(attention, dict) or not isinstance(ffn, dict):
        return text
    named = {
        "num_key_value_heads": attention.get("kv_n_heads"),
        "num_local_experts": ffn.get("moe_num_experts"),
        "num_experts_per_tok": ffn.get("moe_top_k"),
        "intermediate_size": ffn.get("ffn_hidden_size"),
    }
    return {**{key: value for key, value in named.items() if isinstance(value, int)}, **text}


def _kv_heads(text: dict[str, Any], num_heads: int, notes: list[str]) -> Any:
    """The KV heads attention caches. Multi-query attention (Falcon-7B, StarCoder: `multi_query`, unless Falcon's
    `new_decoder_architecture` names them in num_kv_heads) caches one, whatever num_kv_heads says: vLLM's
    FalconModelArchConfigConvertor, transformers' GPTBigCodeConfig."""
    if text.get("multi_query") and not text.get("new_decoder_architecture"):
        notes.append("multi_query: multi-query attention, 1 KV head")
        return 1
    kv_heads = _first(text, _KV_HEADS)
    if kv_heads is None:
        notes.append(f"no num_key_value_heads: multi-head attention, {num_heads} KV heads")
        return num_heads
    return kv_heads


def spec_from_config(
    config: dict[str, Any],
    *,
    name: str,
    source: str,
    where: str,
    source_path: str | None = None,
    published: PublishedCount | None = None,
    aliases: tuple[str, ...] = (),
) -> ModelSpec:
    """Build a ModelSpec. `where` names the file in error messages; `published` is the checkpoint's published
    parameter count, if known. Every field it reads is typed and bounded first (`fields.check_config`)."""
    check_config(config, where)
    notes: list[str] = []
    language = _one_width(_unnested(language_config(config)), where)
    text = with_defaults(language, notes)
    if text.get("model_type") in NOT_MODELLED:
        raise ConfigError(f"{where}: {NOT_MODELLED[text['model_type']]}")
    if isinstance(text.get("per_layer_config"), list) and isinstance(text.get("window_sizes"), list):
        raise ConfigError(f"{where}: {PER_LAYER_ATTENTION}")
    reader = _Reader(text, where)
    num_layers = reader.positive(_LAYERS)
    num_heads = reader.positive(_HEADS)
    hidden = reader.positive(_HIDDEN)

    kv_heads = reader.check_positive("num_key_value_heads", _kv_heads(text, num_heads, notes))
    _check_shape(text, where, num_layers, num_heads, kv_heads)

    head_dim = text.get("head_dim")
    if head_dim is None and hidden % num_heads and text.get("kv_lora_rank"):
        head_dim = text.get("qk_rope_head_dim")  # MLA: transformers' head_dim is qk_rope_head_dim (GLM-4.7-Flash)
    if head_dim is None:
        if hidden % num_heads:
            raise ConfigError(
                f"{where}: no head_dim and hidden_size {hidden} is not divisible by num_attention_heads {num_heads}"
            )
        head_dim = hidden // num_heads
    head_dim = reader.check_positive("head_dim", head_dim)
    if head_dim * num_heads != hidden and "head_dim" in text:
        notes.append(f"explicit head_dim {head_dim} (hidden_size / heads would give {hidden / num_heads:g})")

    layers, extra_caches = _layer_kinds(text, reader, num_layers, kv_heads, head_dim, notes)
    dtype = _serving_dtype(text, config, notes)
    try:
        counted = count_parameters(
            text,
            num_layers=num_layers,
            hidden=hidden,
            num_heads=num_heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            wrapper=config,
            layers=layers,
            beside=next((layer for _, layer in extra_caches if isinstance(layer, (MambaState, Mamba1State))), None),
        )
    except KeyError as missing:  # a field the architecture's count needs (a vision tower's width, an FFN size)
        raise ConfigError(f"{where}: missing {missing.args[0]!r}, which the parameter count needs") from None
    loaded = _loaded_parameters(counted, published, notes)
    encoder = _encoder(config)
    return ModelSpec(
        encoder=encoder,
        name=name,
        source=source,
        source_path=source_path,
        config_json=MappingProxyType(dict(config)),
        model_type=str(text.get("model_type") or config.get("model_type") or "unknown"),
        architectures=tuple(config.get("architectures") or ()),
        dtype=dtype,
        layers=layers,
        hidden_size=hidden,
        num_attention_heads=num_heads,
        vocab_size=vocabulary(text),
        intermediate_size=int(_first(text, _INTERMEDIATE) or 4 * hidden),
        max_position_embeddings=_max_positions(text),
        parameters=loaded,
        parameters_source="catalog" if published else "config",
        checkpoint_parameters=published.total if published else counted.checkpoint,
        count=counted,
        expert_parameters=counted.experts,
        num_experts=counted.num_experts,
        experts_per_token=int(text.get("num_experts_per_tok") or text.get("experts_per_token") or 0),
        moe_intermediate_size=int(text.get("moe_intermediate_size") or 0),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        quantization=_quantization(config, text),
        extra_caches=extra_caches,
        mtp_layers=int(text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers") or 0),
        aliases=aliases,
        notes=tuple(notes),
        warnings=_default_warnings(language, text, where),
    )


def _check_shape(text: dict, where: str, num_layers: int, num_heads: int, kv_heads: int) -> None:
    """Refuse a model no engine can build: KV heads that do not divide the attention heads (grouped-query
    attention shares each KV head among a whole number of query heads: transformers' repeat_kv, vLLM's attention
    layers), more shared-KV layers than layers, more experts per token than experts."""
    if not (text.get("kv_lora_rank") or text.get("block_configs")) and (kv_heads > num_heads or num_heads % kv_heads):
        divisors = [str(d) for d in range(1, num_heads + 1) if num_heads % d == 0]
        shown = ", ".join(divisors if len(divisors) <= 12 else [*divisors[:11], "...", divisors[-1]])
        raise ConfigError(
            f"{where}: num_key_value_heads {kv_heads} does not divide num_attention_heads {num_heads} (each KV head "
            f"serves a whole number of query heads); valid: {shown}"
        )
    shared = int(text.get("num_kv_shared_layers") or 0)
    if shared >= num_layers:
        raise ConfigError(
            f"{where}: num_kv_shared_layers {shared} leaves no layer of {num_layers} with a KV cache of its own; "
            f"valid: 0 to {num_layers - 1}"
        )
    experts = int(text.get("n_routed_experts") or text.get("num_local_experts") or text.get("num_experts") or 0)
    per_token = int(text.get("num_experts_per_tok") or text.get("experts_per_token") or 0)
    if experts and per_token > experts:
        raise ConfigError(
            f"{where}: num_experts_per_tok {per_token} is more than the model's {experts} experts; valid: 1 to {experts}"
        )


def _default_warnings(language: dict, text: dict, where: str) -> tuple[str, ...]:
    """A layer count taken from the architecture's default. Kept, since transformers and vLLM load the config so
    (a composite config leaves out what equals the class default), but said: every KV figure scales with it, and
    a top-level config.json written by transformers always states it."""
    if _first(language, _LAYERS) is not None or _first(text, _LAYERS) is None:
        return ()
    return (
        f"{where}: no num_hidden_layers; {text.get('model_type')}'s default of {_first(text, _LAYERS)} layers is used, "
        "as transformers and vLLM load this config (every KV figure scales with it: add the field if the model differs)",
    )


def _layer_kinds(
    text: dict, reader: _Reader, num_layers: int, kv_heads: int, head_dim: int, notes: list[str]
) -> tuple[tuple[CacheKind, ...], tuple[tuple[int, LayerKind], ...]]:
    """Each decoder layer's cache, and the extra caches some layers keep beside it (the sparse indexer)."""
    if text.get("model_type") in EXPANDED_MLA:
        return _expanded_mla_layers(text, reader, num_layers, notes), ()
    if text.get("kv_lora_rank"):
        return _mla_layers(text, reader, num_layers, head_dim, notes)
    if text.get("block_configs"):
        return _nas_layers(text, reader, num_layers, head_dim, notes), ()
    attention = _attention_layers(text, reader, num_layers, kv_heads, head_dim, notes)
    state = _state_layer(text, reader)
    if text.get("model_type") == "falcon_h1" and state is not None:  # attention and Mamba-2 side by side in each layer
        notes.append(f"parallel hybrid: each of the {num_layers} layers keeps KV and a Mamba-2 state")
        return attention, tuple((index, state) for index in range(num_layers))
    kinds = _hybrid_kinds(text, num_layers, reader.where, notes)
    if kinds is None:
        return attention, ()
    if state is None and "mamba" in kinds:
        raise ConfigError(f"{reader.where}: recurrent layers of {text.get('model_type')!r} are not modelled")
    none = NoCache()
    return tuple(
        attention[i] if kind == "attention" else state if kind == "mamba" and state is not None else none
        for i, kind in enumerate(kinds)
    ), ()


# MLA projections whose attention vLLM runs as plain multi-head attention, caching every head's full key and value
EXPANDED_MLA = ("minicpm3",)


def _expanded_mla_layers(text: dict, reader: _Reader, num_layers: int, notes: list[str]) -> tuple[CacheKind, ...]:
    """MiniCPM3: low-rank (MLA) projections, but vllm/model_executor/models/minicpm3.py builds an Attention of all
    num_attention_heads as KV heads at qk_nope_head_dim + qk_rope_head_dim each, not a latent cache."""
    heads = reader.positive(_HEADS)
    head_dim = reader.positive(("qk_nope_head_dim",)) + reader.positive(("qk_rope_head_dim",))
    notes.append(
        f"{text['model_type']}: MLA projections, but vLLM caches all {heads} heads' keys and values of {head_dim} dims"
    )
    return (FullAttention(heads, head_dim),) * num_layers


def _mla_layers(
    text: dict, reader: _Reader, num_layers: int, head_dim: int, notes: list[str]
) -> tuple[tuple[CacheKind, ...], tuple[tuple[int, LayerKind], ...]]:
    sparse = bool(text.get("index_topk"))
    latent = MultiLatentAttention(
        kv_lora_rank=reader.positive(("kv_lora_rank",)),
        qk_rope_head_dim=reader.positive(("qk_rope_head_dim",)),
        qk_nope_head_dim=reader.check_positive("qk_nope_head_dim", text.get("qk_nope_head_dim") or head_dim),
        v_head_dim=reader.check_positive("v_head_dim", text.get("v_head_dim") or head_dim),
        sparse=sparse,
    )
    kda = _kda_layers(text, reader, num_layers, notes)
    if kda:
        return tuple(kda[1] if index in kda[0] else latent for index in range(num_layers)), ()
    if not sparse:
        return (latent,) * num_layers, ()
    indexer = SparseIndexer(reader.positive(("index_head_dim",)))
    notes.append(
        f"sparse attention (index_topk {text['index_topk']}): each layer also caches an indexer key of {indexer.head_dim} B per token"
    )
    return (latent,) * num_layers, tuple((index, indexer) for index in range(num_layers))


def _kda_layers(text: dict, reader: _Reader, num_layers: int, notes: list[str]) -> tuple[set[int], MambaState] | None:
    """Kimi Linear: the layers linear_attn_config's kda_layers lists (1-based: KimiLinearConfig.is_kda_layer) keep a
    Kimi Delta Attention state, not a latent (vllm/models/kimi_k3/nvidia/kda.py KimiK3DeltaAttention: a conv window
    of 3 x num_heads x head_dim channels and num_heads x head_dim x head_dim recurrent values, float32 unless
    --mamba-ssm-cache-dtype says: MambaStateShapeCalculator.kda_state_shape, MambaStateDtypeCalculator.
    kda_state_dtype)."""
    linear = text.get("linear_attn_config")
    if not isinstance(linear, dict) or not isinstance(linear.get("kda_layers"), list) or not linear["kda_layers"]:
        return None
    if linear.get("gate_lower_bound") is not None:
        raise ConfigError(
            f"{reader.where}: linear_attn_config.gate_lower_bound: a bounded KDA gate runs FlashKDA's prefill, whose "
            f"checkpoint pages kvops does not model yet; {MEASURE_IT}"
        )
    layers = {number - 1 for number in linear["kda_layers"] if isinstance(number, int) and 0 < number <= num_layers}
    where = _Reader(linear, f"{reader.where} linear_attn_config")
    heads, head_dim = where.positive(("num_heads",)), where.positive(("head_dim",))
    state = MambaState(
        variant="kda",
        conv_kernel=where.positive(("short_conv_kernel_size",)),
        conv_channels=heads * head_dim,
        groups=heads,
        group_dim=head_dim,
        heads=heads,
        head_dim=head_dim,
        ssm_dtype="float32",
    )
    notes.append(f"hybrid: {num_layers - len(layers)} MLA layers, {len(layers)} Kimi Delta Attention state layers")
    return layers, state


def _attention_layers(
    text: dict, reader: _Reader, num_layers: int, kv_heads: int, head_dim: int, notes: list[str]
) -> tuple[CacheKind, ...]:
    """Full, sliding or chunked attention per layer (the attention a hybrid model's attention layers use)."""
    full = FullAttention(kv_heads, head_dim, int(text.get("v_head_dim") or 0), _rope_dim(text, head_dim))
    if text.get("global_head_dim") or text.get("num_global_key_value_heads"):  # Gemma 4: wider global layers
        full = FullAttention(
            int(text.get("num_global_key_value_heads") or kv_heads), int(text.get("global_head_dim") or head_dim)
        )
    return _without_shared_kv(text, _attention_kinds(text, reader, num_layers, full, kv_heads, head_dim, notes), notes)


QWEN_VL_MAX_IMAGE_TOKENS = 16384


def _encoder(config: dict) -> EncoderShape | None:
    """The vision encoder the engine's profile run exercises: width and MLP size of its vision_config, and how many
    patches feed one language-model token (Qwen-VL's spatial_merge_size squared; MoonViT's merge_kernel_size;
    SigLIP's patches per image over Gemma 3's mm_tokens_per_image)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict) or not vision.get("hidden_size"):
        return None
    width = int(vision["hidden_size"])
    inter = int(vision.get("intermediate_size") or 4 * width)
    merge = int(vision.get("spatial_merge_size") or config.get("spatial_merge_size") or 1) ** 2
    if vision.get("model_type") == "moonvit":  # Kimi-VL merges merge_kernel_size patches into one token
        merge = merge_kernel(vision)
    tokens = config.get("mm_tokens_per_image")
    if tokens and vision.get("image_size") and vision.get("patch_size"):
        merge = max(1, (int(vision["image_size"]) // int(vision["patch_size"])) ** 2 // int(tokens))
    # Qwen-VL's towers (a temporal patch): their image processors' default ceiling is 16,384 merged tokens an image
    # (Qwen2-VL max_pixels 12,845,056 = 16,384 x 28^2; Qwen3-VL longest_edge 16,777,216 = 16,384 x 32^2)
    largest = QWEN_VL_MAX_IMAGE_TOKENS if vision.get("temporal_patch_size") else 0
    return EncoderShape(width, inter, merge, largest)


def _rope_dim(text: dict, head_dim: int) -> int:
    """Rotary dims of a key under partial rotary (`partial_rotary_factor`, top level or in rope_parameters, as
    vLLM's rope_dim_from_hf_config reads it); 0 when every dim rotates."""
    factor = text.get("partial_rotary_factor")
    if factor is None:
        factor = (text.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0)
    rope = int(head_dim * float(factor))
    return 0 if rope == head_dim else rope


def _attention_kinds(
    text: dict, reader: _Reader, num_layers: int, full: FullAttention, kv_heads: int, head_dim: int, notes: list[str]
) -> tuple[LayerKind, ...]:
    chunked = _chunked_layers(text, num_layers, notes)
    if chunked:
        chunk = ChunkedLocal(kv_heads, head_dim, chunk=reader.positive(("attention_chunk_size",)))
        return tuple(chunk if is_chunked else full for is_chunked in chunked)
    sliding_flags = _sliding_layers(text, num_layers, reader.where, notes)
    if not any(sliding_flags):
        return (full,) * num_layers
    window = reader.positive(("sliding_window",)) + _window_includes_current(text, notes)
    sliding = SlidingWindow(
        int(text.get("swa_num_key_value_heads") or kv_heads),
        int(text.get("swa_head_dim") or head_dim),
        int(text.get("swa_v_head_dim") or text.get("v_head_dim") or 0),
        window=window,
    )
    if full.head_dim != sliding.head_dim or full.num_kv_heads != sliding.num_kv_heads:
        notes.append(
            f"sliding layers: {sliding.num_kv_heads} KV heads x {sliding.head_dim}; full layers: {full.num_kv_heads} x {full.head_dim}"
        )
    return tuple(sliding if is_sliding else full for is_sliding in sliding_flags)


# the families whose sliding layer attends to [pos - sliding_window, pos]: sliding_window + 1 tokens
_INCLUSIVE_WINDOW = ("cohere2", "cohere2_moe")


def _window_includes_current(text: dict, notes: list[str]) -> int:
    """1 where a sliding layer sees sliding_window + 1 tokens, as vLLM builds Command R7B / Command A's
    (vllm/model_executor/models/commandr.py and cohere2_moe.py: per_layer_sliding_window=config.sliding_window + 1)."""
    if text.get("model_type") not in _INCLUSIVE_WINDOW:
        return 0
    notes.append(f"sliding layers attend to sliding_window + 1 = {int(text['sliding_window']) + 1} tokens")
    return 1


def _without_shared_kv(text: dict, layers: tuple[LayerKind, ...], notes: list[str]) -> tuple[CacheKind, ...]:
    """Gemma 3n/4: the last num_kv_shared_layers layers read an earlier layer's KV and keep none of their own."""
    shared = int(text.get("num_kv_shared_layers") or 0)
    if not shared:
        return layers
    notes.append(f"the last {shared} layers share an earlier layer's KV cache and keep none of their own")
    return layers[: len(layers) - shared] + (NoCache(),) * shared


def _chunked_layers(text: dict, num_layers: int, notes: list[str]) -> list[bool]:
    """Llama 4: layers with RoPE (no_rope_layers 1) use chunked local attention, the NoPE ones are global."""
    if not text.get("attention_chunk_size") or text.get("model_type") not in ("llama4_text", "llama4"):
        return []
    interval = int(text.get("no_rope_layer_interval") or 4)
    flags = text.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(num_layers)]
    if "no_rope_layers" not in text:
        notes.append(f"no no_rope_layers: every {interval}th layer is global (NoPE), as the llama4 class default")
    notes.append(
        f"attention_chunk_size {text['attention_chunk_size']}: {sum(flags)} layers attend within their chunk only"
    )
    return [bool(flag) for flag in flags]


# layer_types entries of a recurrent layer: Mamba, linear attention, LFM2's short convolution ("conv")
_RECURRENT_TYPES = ("mamba", "linear_attention", "conv")


def _hybrid_kinds(text: dict, num_layers: int, where: str, notes: list[str]) -> list[str] | None:
    """For hybrid models, "attention", "mamba" (a recurrent state) or "none" per layer, by the rule the model's
    own code applies; None for attention-only models."""
    pattern = text.get("hybrid_override_pattern")
    if pattern:  # Nemotron-H: M Mamba-2, * attention, - MLP, E MoE
        kinds = [{"M": "mamba", "*": "attention"}.get(char, "none") for char in pattern]
    elif text.get("layer_types") and set(_RECURRENT_TYPES) & set(text["layer_types"]):
        kinds = ["mamba" if kind in _RECURRENT_TYPES else "attention" for kind in text["layer_types"]]
    elif text.get("full_attention_interval") and text.get("linear_num_value_heads"):  # Qwen3-Next
        interval = int(text["full_attention_interval"])
        kinds = ["attention" if (i + 1) % interval == 0 else "mamba" for i in range(num_layers)]
    elif isinstance(text.get("attn_type_list"), list) and 0 in text["attn_type_list"]:  # MiniMax-Text-01: 0 linear
        kinds = ["attention" if kind == 1 else "mamba" for kind in text["attn_type_list"]]
    elif text.get("attn_layer_period"):  # Jamba: attention where i % period == offset, Mamba elsewhere
        period, offset = int(text["attn_layer_period"]), int(text.get("attn_layer_offset") or 0)
        kinds = ["attention" if i % period == offset else "mamba" for i in range(num_layers)]
    else:
        return None
    if len(kinds) != num_layers:
        raise ConfigError(f"{where}: the layer pattern lists {len(kinds)} layers but num_hidden_layers is {num_layers}")
    notes.append(
        f"hybrid: {kinds.count('attention')} attention layers, {kinds.count('mamba')} recurrent-state layers"
        + (f", {kinds.count('none')} without cache" if "none" in kinds else "")
    )
    return kinds


def _state_layer(text: dict, reader: _Reader) -> StateKind | None:
    """The recurrent layer's state shape: Gated DeltaNet (Qwen3-Next, Qwen3.5), Mamba-1 (Jamba), Mamba-2
    (Granite-4.0-H, Nemotron-H, Falcon-H1) or a short convolution (LFM2), under each family's field names."""
    if text.get("conv_L_cache"):  # lfm2.py: ShortConv(dim=config.conv_dim), a conv_L_cache-wide window
        return ShortConvState(
            conv_kernel=reader.positive(("conv_L_cache",)), channels=reader.positive(("conv_dim", *_HIDDEN))
        )
    if text.get("linear_num_value_heads"):
        value_heads, value_dim = (
            reader.positive(("linear_num_value_heads",)),
            reader.positive(("linear_value_head_dim",)),
        )
        return MambaState(
            variant="gdn",
            conv_kernel=reader.positive(("linear_conv_kernel_dim",)),
            conv_channels=value_heads * value_dim,
            groups=reader.positive(("linear_num_key_heads",)),
            group_dim=reader.positive(("linear_key_head_dim",)),
            heads=value_heads,
            head_dim=value_dim,
            ssm_dtype=str(text.get("mamba_ssm_dtype") or ""),
        )
    if text.get("model_type") == "jamba":  # jamba.py: MambaMixer(intermediate_size=mamba_expand * hidden_size)
        return Mamba1State(
            conv_kernel=reader.positive(("mamba_d_conv",)),
            intermediate=reader.positive(("mamba_expand",)) * reader.positive(_HIDDEN),
            state_size=reader.positive(("mamba_d_state",)),
        )
    heads = _first(text, ("mamba_num_heads", "mamba_n_heads"))
    if heads is None:
        return None
    head_dim = reader.positive(("mamba_head_dim", "mamba_d_head"))
    return MambaState(
        variant="mamba2",
        conv_kernel=reader.positive(("conv_kernel", "mamba_d_conv")),
        # Falcon-H1's mixer is mamba_d_ssm wide where it says so (falcon_h1.py); the others, heads x head_dim
        conv_channels=int(text.get("mamba_d_ssm") or int(heads) * head_dim),
        groups=reader.positive(("n_groups", "mamba_n_groups")),
        group_dim=reader.positive(("ssm_state_size", "mamba_d_state")),
        heads=int(heads),
        head_dim=head_dim,
        ssm_dtype=str(text.get("mamba_ssm_cache_dtype") or ""),
    )


def _nas_layers(text: dict, reader: _Reader, num_layers: int, head_dim: int, notes: list[str]) -> tuple[CacheKind, ...]:
    """Nemotron NAS (DeciLM): each block's attention has its own KV heads (heads / n_heads_in_group), or none."""
    blocks = text["block_configs"]
    if len(blocks) != num_layers:
        raise ConfigError(
            f"{reader.where}: block_configs lists {len(blocks)} blocks but num_hidden_layers is {num_layers}"
        )
    heads = reader.positive(("num_attention_heads",))
    layers: list[CacheKind] = []
    for block in blocks:
        attention = block.get("attention") or {}
        if attention.get("no_op") or attention.get("replace_with_linear") or not attention.get("n_heads_in_group"):
            layers.append(NoCache())
        else:
            layers.append(FullAttention(heads // int(attention["n_heads_in_group"]), head_dim))
    notes.append(
        f"per-block attention: {sum(layer.kind != 'none' for layer in layers)} of {num_layers} layers cache KV"
    )
    return tuple(layers)


def _sliding_layers(text: dict, num_layers: int, where: str, notes: list[str]) -> list[bool]:
    """Which layers use the sliding window, by the rule the model's own code applies."""
    window = text.get("sliding_window")
    layer_types = text.get("layer_types")
    if isinstance(text.get("hybrid_layer_pattern"), list):  # MiMo-V2: 1 marks a sliding layer, 0 a full one
        layer_types = ["sliding_attention" if flag == 1 else "full_attention" for flag in text["hybrid_layer_pattern"]]
    if layer_types:
        if len(layer_types) != num_layers:
            raise ConfigError(
                f"{where}: layer_types lists {len(layer_types)} layers but num_hidden_layers is {num_layers}"
            )
        return [kind == "sliding_attention" for kind in layer_types]
    if not window:
        if "sliding_window" in text:
            notes.append("sliding_window is null: every layer caches the full context")
        return [False] * num_layers
    if text.get("use_sliding_window") is False:
        notes.append(f"sliding_window {window} ignored: use_sliding_window is false")
        return [False] * num_layers
    pattern = text.get("sliding_window_pattern")
    if isinstance(pattern, str):  # EXAONE 4: "LLLG", one letter a layer, repeated (L slides, G is global)
        notes.append(f"sliding_window_pattern {pattern!r}: {pattern.count('G')} of every {len(pattern)} layers global")
        return [pattern[i % len(pattern)] == "L" for i in range(num_layers)]
    if isinstance(pattern, int) and pattern > 0:
        # Gemma 3: every pattern-th layer (1-based) is global, the rest slide.
        notes.append(f"sliding_window_pattern {pattern}: every {pattern}th layer is full attention")
        return [bool((i + 1) % pattern) for i in range(num_layers)]
    if text.get("model_type") == "gemma2":
        notes.append("gemma2: even layers slide, odd layers are full attention")
        return [i % 2 == 0 for i in range(num_layers)]
    if text.get("use_sliding_window") and text.get("max_window_layers") is not None:
        # Qwen2 family: layers from max_window_layers on use the window.
        first = int(text["max_window_layers"])
        return [i >= first for i in range(num_layers)]
    return [True] * num_layers


def _loaded_parameters(counted: ParameterCount, published: PublishedCount | None, notes: list[str]) -> int:
    """What an engine loads to generate text: the published checkpoint count without what it does not load
    (MTP layers, a stored copy of tied embeddings), else the counted language model and vision tower."""
    if counted.mtp:
        notes.append(
            f"{counted.mtp:,} parameters of multi-token-prediction layers are in the checkpoint; vLLM loads them only for MTP speculative decoding"
        )
    if counted.vision:
        notes.append(f"{counted.vision:,} parameters of the vision tower and projector are loaded with the model")
    if published is None:
        return counted.total + counted.vision
    if published.stores_tied_head:
        notes.append(
            f"the checkpoint stores lm_head.weight ({counted.embeddings:,} parameters) although it is tied to the embeddings: loaded once"
        )
    return published.loaded(counted)


def _quantization(config: dict, text: dict) -> dict | None:
    """The checkpoint's quantization_config; NVIDIA ModelOpt's hf_quant_config.json form (its settings under
    "quantization", no quant_method) is read as quant_method "modelopt", as vLLM reads it."""
    quant = config.get("quantization_config") or text.get("quantization_config")
    if isinstance(quant, dict) and "quant_method" not in quant and isinstance(quant.get("quantization"), dict):
        return {"quant_method": "modelopt", **quant["quantization"]}
    return quant


def _serving_dtype(text: dict, config: dict, notes: list[str]) -> str:
    """The dtype engines serve the checkpoint in with --dtype auto: its own, but float32 is downcast to bf16."""
    declared = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    dtype = canonical_dtype_name(str(declared)) if declared else None
    if dtype is None:
        notes.append(f"torch_dtype {declared!r} not recognised: assuming bf16")
        return "bf16"
    if dtype == "fp32":
        notes.append("float32 checkpoint: vLLM and TGI serve it in bf16 with --dtype auto")
        return "bf16"
    return dtype


def _max_positions(text: dict) -> int | None:
    value = (
        text.get("max_position_embeddings")
        or text.get("n_positions")
        or text.get("max_seq_len")
        or text.get("max_sequence_length")
        or text.get("seq_length")
    )
    return int(value) if value else None


def _first(config: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


class _Reader:
    """Reads required integer fields, naming the field and the file when one is missing or bad."""

    def __init__(self, config: dict, where: str):
        self.config = config
        self.where = where

    def positive(self, keys: tuple[str, ...]) -> int:
        value = _first(self.config, keys)
        if value is None:
            raise ConfigError(f"{self.where}: missing {keys[0]!r}, which the KV formula needs")
        return self.check_positive(keys[0], value)

    def check_positive(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value <= 0:
            raise ConfigError(f"{self.where}: {key!r} is {value!r}; it must be a positive integer")
        return int(value)
