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

from typing import Any

from kvops.dtypes import canonical_dtype_name
from kvops.errors import ConfigError
from kvops.model.defaults import with_defaults
from kvops.model.params import ParameterCount, count_parameters
from kvops.model.spec import FullAttention, LayerKind, ModelSpec, MultiLatentAttention, SlidingWindow

# Field names differ between architectures; the first one present wins.
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
_INTERMEDIATE = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")


def language_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's fields: a nested text_config wins over the wrapper's own keys."""
    text = config.get("text_config")
    if isinstance(text, dict) and not _first(config, _LAYERS):
        merged = {key: value for key, value in config.items() if key != "text_config"}
        merged.update({key: value for key, value in text.items() if value is not None or key not in merged})
        return merged
    return config


def spec_from_config(
    config: dict[str, Any],
    *,
    name: str,
    source: str,
    where: str,
    source_path: str | None = None,
    parameters: int | None = None,
    aliases: tuple[str, ...] = (),
    stored_tied_head: bool = False,
) -> ModelSpec:
    """Build a ModelSpec. `where` names the file in error messages; `parameters` is a published count of the
    checkpoint, if known; `stored_tied_head`: the checkpoint stores lm_head.weight although it is tied."""
    notes: list[str] = []
    text = with_defaults(language_config(config), notes)
    reader = _Reader(text, where)
    num_layers = reader.positive(_LAYERS)
    num_heads = reader.positive(_HEADS)
    hidden = reader.positive(_HIDDEN)

    kv_heads = _first(text, _KV_HEADS)
    if kv_heads is None:
        kv_heads = num_heads
        notes.append(f"no num_key_value_heads: multi-head attention, {num_heads} KV heads")
    kv_heads = reader.check_positive("num_key_value_heads", kv_heads)

    head_dim = text.get("head_dim")
    if head_dim is None:
        if hidden % num_heads:
            raise ConfigError(
                f"{where}: no head_dim and hidden_size {hidden} is not divisible by num_attention_heads {num_heads}"
            )
        head_dim = hidden // num_heads
    head_dim = reader.check_positive("head_dim", head_dim)
    if head_dim * num_heads != hidden and "head_dim" in text:
        notes.append(f"explicit head_dim {head_dim} (hidden_size / heads would give {hidden / num_heads:g})")

    layers = _layer_kinds(text, reader, num_layers, kv_heads, head_dim, notes)
    dtype = _serving_dtype(text, config, notes)
    counted = count_parameters(
        text,
        num_layers=num_layers,
        hidden=hidden,
        num_heads=num_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        wrapper=config,
    )
    loaded = _loaded_parameters(counted, parameters, stored_tied_head, notes)
    return ModelSpec(
        name=name,
        source=source,
        source_path=source_path,
        model_type=str(text.get("model_type") or config.get("model_type") or "unknown"),
        architectures=tuple(config.get("architectures") or ()),
        dtype=dtype,
        layers=layers,
        hidden_size=hidden,
        num_attention_heads=num_heads,
        vocab_size=int(text.get("vocab_size") or 0),
        intermediate_size=int(_first(text, _INTERMEDIATE) or 4 * hidden),
        max_position_embeddings=_max_positions(text),
        parameters=loaded,
        parameters_source="catalog" if parameters else "config",
        checkpoint_parameters=parameters or counted.checkpoint,
        mtp_parameters=counted.mtp,
        vision_parameters=counted.vision,
        expert_parameters=counted.experts,
        num_experts=counted.num_experts,
        experts_per_token=int(text.get("num_experts_per_tok") or text.get("experts_per_token") or 0),
        moe_intermediate_size=int(text.get("moe_intermediate_size") or 0),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        quantization=_quantization(config, text),
        aliases=aliases,
        notes=tuple(notes),
    )


def _layer_kinds(
    text: dict, reader: _Reader, num_layers: int, kv_heads: int, head_dim: int, notes: list[str]
) -> tuple[LayerKind, ...]:
    if text.get("kv_lora_rank"):
        latent = MultiLatentAttention(
            kv_lora_rank=reader.positive(("kv_lora_rank",)),
            qk_rope_head_dim=reader.positive(("qk_rope_head_dim",)),
            qk_nope_head_dim=reader.check_positive("qk_nope_head_dim", text.get("qk_nope_head_dim") or head_dim),
            v_head_dim=reader.check_positive("v_head_dim", text.get("v_head_dim") or head_dim),
        )
        return (latent,) * num_layers
    full = FullAttention(kv_heads, head_dim)
    sliding_flags = _sliding_layers(text, num_layers, reader.where, notes)
    if not any(sliding_flags):
        return (full,) * num_layers
    window = reader.positive(("sliding_window",))
    sliding = SlidingWindow(kv_heads, head_dim, window=window)
    return tuple(sliding if is_sliding else full for is_sliding in sliding_flags)


def _sliding_layers(text: dict, num_layers: int, where: str, notes: list[str]) -> list[bool]:
    """Which layers use the sliding window, by the rule the model's own code applies."""
    window = text.get("sliding_window")
    layer_types = text.get("layer_types")
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


def _loaded_parameters(counted: ParameterCount, published: int | None, stored_tied_head: bool, notes: list[str]) -> int:
    """What an engine loads to generate text: the published checkpoint count without what it does not load
    (MTP layers, a stored copy of tied embeddings), else the counted language model and vision tower."""
    if counted.mtp:
        notes.append(
            f"{counted.mtp:,} parameters of multi-token-prediction layers are in the checkpoint; vLLM loads them only for MTP speculative decoding"
        )
    if counted.vision:
        notes.append(f"{counted.vision:,} parameters of the vision tower and projector are loaded with the model")
    if not published:
        return counted.total + counted.vision
    tied_copy = 0
    if stored_tied_head:
        tied_copy = counted.embeddings
        notes.append(
            f"the checkpoint stores lm_head.weight ({tied_copy:,} parameters) although it is tied to the embeddings: loaded once"
        )
    return published - counted.mtp - tied_copy


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
