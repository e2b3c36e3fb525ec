"""The config.json fields kvops reads, typed and bounded before any arithmetic.

A config.json is user input: a field of the wrong type ("32" as a string, a list, true), a value no model has
(1e308, Infinity, NaN, a negative vocabulary, `num_hidden_layers: 1e9`, which would build a billion layers) or
an impossible shape (7 KV heads for 32 attention heads) is one line naming the field, the file and what is valid,
never a traceback or a computation that runs away. Null stays allowed wherever kvops reads a field with a fallback
(`"sliding_window": null` is how many models say "no window"). Fields kvops does not read are not looked at.

The bounds are far past every real model (the catalog's largest: 126 layers, 512 experts, 10,485,760 positions)
and small enough that nothing sized by them can exhaust memory or time.
"""

from __future__ import annotations

from typing import Any

from kvops.errors import ConfigError

MAX_LAYERS = 4096
MAX_HEADS = 1 << 16
MAX_WIDTH = 1 << 20  # hidden sizes, head dims, ranks, intermediate sizes
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 32  # context lengths, windows, chunks
MAX_EXPERTS = 1 << 16

_RANGES: dict[tuple[str, ...], tuple[int, int]] = {
    (
        "num_hidden_layers",
        "n_layer",
        "num_layers",
        "n_layers",
        "mtp_num_hidden_layers",
        "num_nextn_predict_layers",
        "first_k_dense_replace",
        "max_window_layers",
        "num_kv_shared_layers",
        "depth",
        "attn_layer_period",
        "attn_layer_offset",
        "expert_layer_period",
        "expert_layer_offset",
    ): (0, MAX_LAYERS),
    (
        "num_attention_heads",
        "n_head",
        "num_heads",
        "n_heads",
        "num_key_value_heads",
        "num_kv_heads",
        "n_head_kv",
        "multi_query_group_num",
        "num_global_key_value_heads",
        "swa_num_key_value_heads",
        "index_n_heads",
        "linear_num_value_heads",
        "linear_num_key_heads",
        "mamba_num_heads",
        "mamba_n_heads",
        "n_groups",
        "mamba_n_groups",
    ): (0, MAX_HEADS),
    (
        "hidden_size",
        "n_embd",
        "d_model",
        "dim",
        "head_dim",
        "intermediate_size",
        "ffn_dim",
        "n_inner",
        "ffn_hidden_size",
        "v_head_dim",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "kv_lora_rank",
        "q_lora_rank",
        "index_head_dim",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "shared_intermediate_size",
        "global_head_dim",
        "swa_head_dim",
        "swa_v_head_dim",
        "linear_value_head_dim",
        "linear_key_head_dim",
        "linear_conv_kernel_dim",
        "mamba_head_dim",
        "mamba_d_head",
        "conv_kernel",
        "mamba_d_conv",
        "ssm_state_size",
        "mamba_d_state",
        "mamba_d_ssm",
        "mamba_dt_rank",
        "mamba_expand",
        "intermediate_size_mlp",
        "moe_latent_size",
        "word_embed_proj_dim",
        "out_hidden_size",
        "patch_size",
        "image_size",
        "num_channels",
        "in_channels",
        "temporal_patch_size",
        "spatial_merge_size",
        "num_position_embeddings",
        "init_pos_emb_height",
        "init_pos_emb_width",
        "mm_tokens_per_image",
    ): (0, MAX_WIDTH),
    ("vocab_size", "padded_vocab_size"): (0, MAX_VOCAB),
    (
        "max_position_embeddings",
        "n_positions",
        "max_sequence_length",
        "seq_length",
        "sliding_window",
        "attention_chunk_size",
        "index_topk",
    ): (0, MAX_POSITIONS),
    (
        "num_experts",
        "num_local_experts",
        "n_routed_experts",
        "n_shared_experts",
        "num_experts_per_tok",
        "experts_per_token",
        "interleave_moe_layer_step",
        "sliding_window_pattern",
        "no_rope_layer_interval",
        "full_attention_interval",
    ): (0, MAX_EXPERTS),
}
WHOLE_NUMBERS: dict[str, tuple[int, int]] = {name: bounds for names, bounds in _RANGES.items() for name in names}
# numbers Hunyuan's MoE configs give one a layer (transformers' HunYuanMoEV1Config: int | list)
PER_LAYER_NUMBERS = ("moe_intermediate_size", "intermediate_size")
WHOLE_NUMBERS.update(dict.fromkeys(("patch_size", "temporal_patch_size"), (1, MAX_WIDTH)))  # divisors
NUMBERS = {"partial_rotary_factor": (0.0, 1.0)}
TEXTS = ("model_type", "hybrid_override_pattern", "mtp_hybrid_override_pattern")
NESTED = ("rope_parameters",)  # objects of the same fields, read where the top level lacks them
MAPPINGS = ("text_config", "vision_config", "audio_config", "quantization_config")
# lists kvops reads, and what each item must be
LISTS: dict[str, tuple[type, ...]] = {
    "architectures": (str,),
    "layer_types": (str,),
    "no_rope_layers": (int,),
    "hybrid_layer_pattern": (int,),
    "mlp_only_layers": (int,),
    "deepstack_visual_indexes": (int,),
    "merge_kernel_size": (int,),
    "block_configs": (dict,),
}
# quantization_config fields the engines read, by the same rules
QUANT_WHOLE_NUMBERS = {"bits": (1, 64), "w_bit": (1, 64), "num_bits": (1, 64), "group_size": (-1, MAX_WIDTH)}
QUANT_WHOLE_NUMBERS["q_group_size"] = QUANT_WHOLE_NUMBERS["group_size"]
QUANT_TEXTS = ("quant_method", "quant_algo", "format", "bnb_4bit_quant_type", "type")
QUANT_SECTIONS = ("weights", "quantization")  # objects of the same fields (compressed-tensors, ModelOpt)
QUANT_GROUPS = ("config_groups", "quantized_layers")  # objects of such objects, by group or layer name


def check_config(config: Any, where: str) -> None:
    """Refuse the first field of a config.json (its text, vision and audio parts and quantization_config included)
    that kvops reads and cannot use, naming it and what is valid."""
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: a config.json must hold a JSON object")
    _check_fields(config, where, "")
    for section in MAPPINGS:
        part = config.get(section)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise ConfigError(f"{where}: {section!r} is {_shown(part)}; valid: an object of fields, or null")
        if section == "quantization_config":
            check_quantization(part, where, f"{section}.")
        else:
            _check_fields(part, where, f"{section}.")
            quant = part.get("quantization_config")
            if quant is not None:
                check_quantization(quant, where, f"{section}.quantization_config.")
    for index, block in enumerate(config.get("block_configs") or ()):
        _check_block(block, where, f"block_configs[{index}]")


def _window_letters(value: str, where: str, name: str) -> None:
    """EXAONE 4 writes its pattern as letters, one a layer, repeated: "LLLG" (L sliding, G global)."""
    if not value or set(value) - {"L", "G"}:
        raise ConfigError(
            f"{where}: {name!r} is {_shown(value)}; valid: a whole number, or letters L (sliding) and G (global)"
        )


def _check_fields(fields: dict, where: str, prefix: str) -> None:
    for key, value in fields.items():
        if value is None:
            continue
        name = f"{prefix}{key}"
        if key == "sliding_window_pattern" and isinstance(value, str):
            _window_letters(value, where, name)
        elif key in PER_LAYER_NUMBERS and isinstance(value, list):
            _check_list(value, where, name, (int,), WHOLE_NUMBERS[key])
        elif key in WHOLE_NUMBERS:
            whole_number(value, where, name, *WHOLE_NUMBERS[key])
        elif key in NUMBERS:
            number(value, where, name, *NUMBERS[key])
        elif key in TEXTS and not isinstance(value, str):
            raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: a string")
        elif key in NESTED:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: an object of fields, or null")
            _check_fields(value, where, f"{name}.")
        elif key in LISTS:
            _check_list(value, where, name, LISTS[key])


def _check_list(
    value: Any, where: str, name: str, kinds: tuple[type, ...], bounds: tuple[int, int] = (-MAX_LAYERS, MAX_LAYERS)
) -> None:
    if not isinstance(value, list) or len(value) > MAX_LAYERS:
        raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: a list of at most {MAX_LAYERS} items")
    wanted = "strings" if kinds == (str,) else "whole numbers" if kinds == (int,) else "objects"
    for index, item in enumerate(value):
        # by default a layer index or a 0/1 flag
        small = isinstance(item, int) and not isinstance(item, bool) and bounds[0] <= item <= bounds[1]
        if not isinstance(item, kinds) or (kinds == (int,) and not small):
            raise ConfigError(f"{where}: '{name}[{index}]' is {_shown(item)}; valid: a list of {wanted}")


def _check_block(block: dict, where: str, name: str) -> None:
    """A Nemotron NAS block: its attention and ffn objects, n_heads_in_group a positive whole number."""
    for part in ("attention", "ffn"):
        value = block.get(part)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{where}: '{name}.{part}' is {_shown(value)}; valid: an object, or null")
    attention = block.get("attention") or {}
    if attention.get("n_heads_in_group") is not None:
        whole_number(attention["n_heads_in_group"], where, f"{name}.attention.n_heads_in_group", 1, MAX_HEADS)
    ffn = block.get("ffn") or {}
    if ffn.get("ffn_mult") is not None:
        number(ffn["ffn_mult"], where, f"{name}.ffn.ffn_mult", 0.0, 1024.0)


def check_quantization(quant: Any, where: str, prefix: str = "quantization_config.") -> None:
    """The quantization_config fields an engine reads to size the weights."""
    if not isinstance(quant, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.')!r} is {_shown(quant)}; valid: an object of fields, or null")
    for key, value in quant.items():
        name = f"{prefix}{key}"
        if value is None:
            continue
        if key in QUANT_WHOLE_NUMBERS:
            whole_number(value, where, name, *QUANT_WHOLE_NUMBERS[key])
        elif key in QUANT_TEXTS and not isinstance(value, str):
            raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: a string")
        elif key == "weight_block_size":
            _check_block_size(value, where, name)
        elif key in QUANT_SECTIONS:
            check_quantization(value, where, f"{name}.")
        elif key in QUANT_GROUPS:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: an object")
            for child, part in value.items():
                if isinstance(part, dict) or key == "quantized_layers":  # the engines skip a non-object group
                    check_quantization(part, where, f"{name}.{child}.")


def _check_block_size(value: Any, where: str, name: str) -> None:
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: two whole numbers [rows, columns]")
    for index, item in enumerate(value):
        whole_number(item, where, f"{name}[{index}]", 1, MAX_WIDTH)


def whole_number(value: Any, where: str, name: str, low: int, high: int) -> int:
    """An integer (or a float with no fraction, as some exporters write 4096.0) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: a whole number from {low:,} to {high:,}")
    if isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: a whole number from {low:,} to {high:,}")
    if not low <= value <= high:
        raise ConfigError(
            f"{where}: {name!r} is {_shown(value)}, out of range; valid: a whole number from {low:,} to {high:,}"
        )
    return int(value)


def number(value: Any, where: str, name: str, low: float, high: float) -> float:
    """A finite number within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"{where}: {name!r} is {_shown(value)}; valid: a number from {low:g} to {high:g}")
    return float(value)


def _shown(value: Any) -> str:
    """A value as the user wrote it, kept short: '32' (a string), 1e+308, [...] (a list)."""
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"{text!r} (a string)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, float):
        return {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(repr(value), f"{value:g}")
    text = str(value)
    return text if len(text) <= 40 else f"a {len(text)}-digit number"
