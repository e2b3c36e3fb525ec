"""Architecture defaults for fields a config.json may leave out.

A Hugging Face config.json lists only what differs from its configuration class's defaults; the model is then
loaded with those defaults. google/gemma-3-12b-it, for one, has no head_dim (256, not hidden/heads = 240) and
no sliding-window pattern. These are the class defaults of the fields kvops reads, as transformers 5.19.0's
configuration classes set them (head_dim only where the default is a constant, not hidden // heads).
tests/test_config_defaults.py checks this table against the installed transformers when it is importable.
"""

from __future__ import annotations

ARCHITECTURE_DEFAULTS: dict[str, dict] = {
    "llama": {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
    },
    "mistral": {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
    },
    "mixtral": {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "max_position_embeddings": 131072,
        "sliding_window": None,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "qwen2": {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": 28,
    },
    "qwen3": {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "hidden_size": 4096,
        "head_dim": 128,
        "intermediate_size": 22016,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": 28,
    },
    "qwen3_moe": {
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "sliding_window": None,
        "use_sliding_window": False,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
    },
    "phi3": {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "vocab_size": 32064,
        "max_position_embeddings": 4096,
        "sliding_window": None,
    },
    "gemma": {
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "hidden_size": 3072,
        "head_dim": 256,
        "intermediate_size": 24576,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "gemma2": {
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "hidden_size": 2304,
        "head_dim": 256,
        "intermediate_size": 9216,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "tie_word_embeddings": True,
    },
    "gemma3_text": {
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "hidden_size": 2304,
        "head_dim": 256,
        "intermediate_size": 9216,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
    "deepseek_v2": {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "vocab_size": 102400,
        "max_position_embeddings": 2048,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "q_lora_rank": 1536,
        "moe_intermediate_size": 1407,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "first_k_dense_replace": 0,
    },
    "deepseek_v3": {
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "vocab_size": 129280,
        "max_position_embeddings": 4096,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "q_lora_rank": 1536,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
    },
    "gpt_oss": {
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "hidden_size": 2880,
        "head_dim": 64,
        "intermediate_size": 2880,
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "sliding_window": 128,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
    },
    "nemotron_h": {
        "mlp_hidden_act": "relu2",
        "mamba_ssm_cache_dtype": "float32",
        "use_conv_bias": True,
        "mamba_proj_bias": False,
    },
    "falcon_h1": {  # transformers' FalconH1Config
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "mamba_rms_norm": False,
    },
    "granitemoehybrid": {
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
    },
    "opt": {
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "hidden_size": 768,
        "ffn_dim": 3072,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
}


def with_defaults(text: dict, notes: list[str]) -> dict:
    """The config with its architecture's defaults filled in where a key is absent (an explicit null stays null)."""
    defaults = ARCHITECTURE_DEFAULTS.get(str(text.get("model_type")), {})
    missing = {key: value for key, value in defaults.items() if key not in text}
    kv_relevant = sorted(key for key in missing if key in _KV_FIELDS)
    if kv_relevant:
        notes.append(
            f"{text['model_type']} defaults for fields absent from config.json: "
            + ", ".join(f"{key}={missing[key]}" for key in kv_relevant)
        )
    return {**missing, **text}


_KV_FIELDS = {
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "head_dim",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "sliding_window_pattern",
    "kv_lora_rank",
    "qk_rope_head_dim",
}
