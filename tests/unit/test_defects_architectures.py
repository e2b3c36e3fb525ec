"""Architectures outside kvops' catalog that vLLM 0.32 serves, against the model vLLM builds from their config.json.

Each config below is the published config.json of the named Hugging Face repository (huggingface.co/<repo>, file
config.json), cut to the fields kvops and vLLM read. vLLM's figures come from its model built on the meta device
(tests/support/vllm_specs.py): each layer's KV-cache page at block 16, its parameters (less the rows vLLM pads its
vocabulary to), its max_model_len. The 0.33.0 and 0.34.0 wheels build these layers the same way (the files cited).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

# stepfun-ai/step3, config.json text_config (Step3TextForCausalLM): one KV head for all 64 query heads, named
# num_attention_groups (vllm/transformers_utils/configs/step3_vl.py Step3TextConfig)
STEP3_TEXT = {
    "architectures": ["Step3TextForCausalLM"],
    "model_type": "step3_text",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 64,
    "num_attention_groups": 1,
    "head_dim": 256,
    "share_q_dim": 2048,
    "num_hidden_layers": 61,
    "max_seq_len": 65536,
    "max_position_embedding": 65536,
    "vocab_size": 128815,
    "moe_intermediate_size": 5120,
    "moe_num_experts": 48,
    "moe_top_k": 3,
    "moe_layers_enum": ",".join(str(index) for index in range(4, 60)),
    "share_expert_dim": 5120,
    "norm_expert_weight": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000,
    "torch_dtype": "bfloat16",
}
# Step-3.5-Flash's shape (stepfun-ai/Step-3.5-Flash as public ports of it give it: 45 layers, 1 full then 3 sliding
# over 512, 8 KV groups, 96 query heads on the sliding layers, 288 experts of 1280 in layers 3-44); the figures
# checked are vLLM's own for this config (vllm/model_executor/models/step3p5.py)
STEP35 = {
    "architectures": ["Step3p5ForCausalLM"],
    "model_type": "step3p5",
    "hidden_size": 4096,
    "intermediate_size": 11264,
    "num_hidden_layers": 45,
    "num_attention_heads": 64,
    "num_attention_groups": 8,
    "head_dim": 128,
    "vocab_size": 128896,
    "max_seq_len": 262144,
    "max_position_embeddings": 262144,
    "moe_num_experts": 288,
    "moe_top_k": 8,
    "moe_intermediate_size": 1280,
    "share_expert_dim": 1280,
    "moe_layers_enum": ",".join(str(index) for index in range(3, 45)),
    "layer_types": (["full_attention"] + ["sliding_attention"] * 3) * 11 + ["full_attention"],
    "sliding_window": 512,
    "attention_other_setting": {
        "attention_type": "sliding_attention",
        "num_attention_heads": 96,
        "num_attention_groups": 8,
        "head_dim": 128,
    },
    "use_head_wise_attn_gate": True,
    "use_qk_norm": True,
    "rope_theta": [5000000.0] + [10000.0] * 44,
    "partial_rotary_factors": [0.5] + [1.0] * 44,
    "yarn_only_types": ["full_attention"],
    "moe_router_activation": "sigmoid",
    "need_fp32_gate": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# openbmb/MiniCPM3-4B, config.json: MLA projections (kv_lora_rank 256)
MINICPM3 = {
    "architectures": ["MiniCPM3ForCausalLM"],
    "model_type": "minicpm3",
    "hidden_size": 2560,
    "intermediate_size": 6400,
    "num_attention_heads": 40,
    "num_key_value_heads": 40,
    "num_hidden_layers": 62,
    "max_position_embeddings": 32768,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "q_lora_rank": 768,
    "kv_lora_rank": 256,
    "v_head_dim": 64,
    "vocab_size": 73448,
    "scale_emb": 12,
    "scale_depth": 1.4,
    "dim_model_base": 256,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# LiquidAI/LFM2-1.2B, config.json: 6 attention layers (full_attn_idxs), the other 10 short convolutions
LFM2 = {
    "architectures": ["Lfm2ForCausalLM"],
    "model_type": "lfm2",
    "hidden_size": 2048,
    "block_dim": 2048,
    "block_ff_dim": 12288,
    "block_auto_adjust_ff_dim": True,
    "block_ffn_dim_multiplier": 1.0,
    "block_multiple_of": 256,
    "conv_dim": 2048,
    "conv_dim_out": 2048,
    "conv_L_cache": 3,
    "conv_bias": False,
    "full_attn_idxs": [2, 5, 8, 10, 12, 14],
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 16,
    "max_position_embeddings": 128000,
    "vocab_size": 65536,
    "norm_eps": 1e-05,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
# CohereForAI/c4ai-command-r7b-12-2024, config.json: every 4th layer global, the rest sliding over 4096
COMMAND_R7B = {
    "architectures": ["Cohere2ForCausalLM"],
    "model_type": "cohere2",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 32,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "sliding_window_pattern": 4,
    "vocab_size": 256000,
    "logit_scale": 0.25,
    "rope_theta": 50000,
    "layer_norm_eps": 1e-05,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "bytes_per_token", "why"),
    [
        # kvops read 64 KV heads (num_key_value_heads absent): 3,997,696 B a token, 64 x vLLM's. step3_text.py
        # builds Attention(num_kv_heads=1): 61 layers x 2 x 1 x 256 x 2 B
        (STEP3_TEXT, 61 * 2 * 1 * 256 * 2, "num_attention_groups"),
        # Step-3.5: kvops read 64 KV heads, 1,474,560 B a token; step3p5.py builds 8 (num_attention_groups)
        (STEP35, 45 * 2 * 8 * 128 * 2, "num_attention_groups"),
        # kvops read an MLA latent (256 + 32) x 2 B = 35,712 B a token, 1/26.7 of vLLM's: minicpm3.py builds
        # Attention(num_heads, qk_head_dim, num_kv_heads=num_heads), 62 layers x 2 x 40 x (64 + 32) x 2 B
        (MINICPM3, 62 * 2 * 40 * 96 * 2, "minicpm3"),
        # kvops read 16 attention layers (32,768 B a token): lfm2.py builds 6 (full_attn_idxs) and 10 ShortConv
        (LFM2, 6 * 2 * 8 * 64 * 2, "lfm2"),
    ],
    ids=["step3", "step3.5", "minicpm3", "lfm2"],
)
def test_kv_bytes_per_token(config, bytes_per_token, why, run_kvops, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    kv = json.loads(run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", "--json").stdout)
    assert kv["bytes_per_token"] == bytes_per_token, why


def test_lfm2_short_convolution_state(run_kvops, tmp_path):
    # vllm/model_executor/layers/mamba/mamba_utils.py short_conv_state_shape: (conv_L_cache - 1) x conv_dim, no SSM
    (tmp_path / "config.json").write_text(json.dumps(LFM2))
    kv = json.loads(run_kvops("kv", "--model", str(tmp_path), "--tokens", "8192", "--json").stdout)
    state = next(group for group in kv["layer_groups"] if group["kind"] == "mamba")
    assert (state["layers"], state["bytes_per_sequence"]) == (10, 10 * 2 * 2048 * 2)


def test_command_r7b_sliding_layers_keep_window_plus_one(run_kvops, tmp_path):
    # commandr.py: per_layer_sliding_window=config.sliding_window + 1 (the layer sees [pos - 4096, pos]); kvops
    # kept 4096 tokens on the 24 sliding layers
    (tmp_path / "config.json").write_text(json.dumps(COMMAND_R7B))
    kv = json.loads(run_kvops("kv", "--model", str(tmp_path), "--tokens", "8192", "--json").stdout)
    sliding = next(group for group in kv["layer_groups"] if group["kind"] == "sliding")
    assert (sliding["layers"], sliding["window"], sliding["cached_tokens"]) == (24, 4097, 4097)


def test_command_r7b_without_its_window_is_capped_at_the_configs(run_kvops, tmp_path):
    # --disable-sliding-window caps the context at hf_text_config.sliding_window (vllm/config/model.py
    # _get_and_verify_max_len), 4096, not at the 4097 tokens its layers see: kvops planned 4097, which vLLM refuses
    (tmp_path / "config.json").write_text(json.dumps(COMMAND_R7B))
    args = ("plan", "--model", str(tmp_path), "--gpu", "H100-80GB", "--disable-sliding-window", "--json")
    assert json.loads(run_kvops(*args).stdout)["capacity"]["max_model_len"] == 4096


# GPT-style families: LayerNorms, a two-matrix MLP, biases, learned positions, tied heads by their config class
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12}
GPT2 |= {
    "n_positions": 1024,
    "n_ctx": 1024,
    "vocab_size": 50257,
    "activation_function": "gelu_new",
}  # openai-community/gpt2
GPT_J = {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28}
GPT_J |= {
    "n_positions": 2048,
    "rotary_dim": 64,
    "vocab_size": 50400,
    "tie_word_embeddings": False,
}  # EleutherAI/gpt-j-6b
GPT_NEOX_20B = {  # EleutherAI/gpt-neox-20b
    "architectures": ["GPTNeoXForCausalLM"],
    "model_type": "gpt_neox",
    "hidden_size": 6144,
    "intermediate_size": 24576,
    "num_attention_heads": 64,
    "num_hidden_layers": 44,
    "max_position_embeddings": 2048,
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
    "vocab_size": 50432,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
STARCODER = {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48}
STARCODER |= {
    "n_layer": 40,
    "n_inner": 24576,
    "n_positions": 8192,
    "multi_query": True,
    "vocab_size": 49152,
}  # bigcode/starcoder
BLOOM_7B1 = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "hidden_size": 4096, "n_head": 32}
BLOOM_7B1 |= {"n_layer": 30, "vocab_size": 250880}  # bigscience/bloom-7b1
FALCON_7B = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 4544, "bias": False}
FALCON_7B |= {"multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71, "parallel_attn": True}
FALCON_7B |= {
    "num_hidden_layers": 32,
    "vocab_size": 65024,
    "alibi": False,
    "torch_dtype": "bfloat16",
}  # tiiuae/falcon-7b
FALCON_40B = {**FALCON_7B, "hidden_size": 8192, "new_decoder_architecture": True, "num_attention_heads": 128}
FALCON_40B |= {"num_kv_heads": 8, "num_hidden_layers": 60}  # tiiuae/falcon-40b
NEMOTRON_MINI = {  # nvidia/Nemotron-Mini-4B-Instruct
    "architectures": ["NemotronForCausalLM"],
    "model_type": "nemotron",
    "hidden_size": 3072,
    "intermediate_size": 9216,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "kv_channels": 128,
    "num_hidden_layers": 32,
    "max_position_embeddings": 4096,
    "partial_rotary_factor": 0.5,
    "vocab_size": 256000,
    "hidden_act": "relu2",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
CHATGLM3 = {  # THUDM/chatglm3-6b: the SwiGLU MLP is ffn_hidden_size wide, q, k and v carry biases (add_qkv_bias)
    "architectures": ["ChatGLMModel"],
    "model_type": "chatglm",
    "add_bias_linear": False,
    "add_qkv_bias": True,
    "apply_residual_connection_post_layernorm": False,
    "ffn_hidden_size": 13696,
    "hidden_size": 4096,
    "kv_channels": 128,
    "multi_query_attention": True,
    "multi_query_group_num": 2,
    "num_attention_heads": 32,
    "num_layers": 28,
    "original_rope": True,
    "padded_vocab_size": 65024,
    "post_layer_norm": True,
    "rmsnorm": True,
    "seq_length": 8192,
    "tie_word_embeddings": False,
    "vocab_size": 65024,
    "torch_dtype": "float16",
}

EXAONE4_32B = {  # LGAI-EXAONE/EXAONE-4.0-32B: its pattern written as letters, its layers listed in layer_types
    "architectures": ["Exaone4ForCausalLM"],
    "model_type": "exaone4",
    "hidden_size": 5120,
    "intermediate_size": 27392,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 64,
    "max_position_embeddings": 131072,
    "sliding_window": 4096,
    "sliding_window_pattern": "LLLG",
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 16,
    "rope_scaling": {
        "factor": 16.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "vocab_size": 102400,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
GLM_47_FLASH = {  # zai-org/GLM-4.7-Flash: MLA, hidden_size 2048 not a multiple of its 20 heads, no head_dim
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "model_type": "glm4_moe_lite",
    "hidden_size": 2048,
    "intermediate_size": 10240,
    "moe_intermediate_size": 1536,
    "num_attention_heads": 20,
    "num_key_value_heads": 20,
    "num_hidden_layers": 47,
    "kv_lora_rank": 512,
    "q_lora_rank": 768,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 192,
    "v_head_dim": 256,
    "n_routed_experts": 64,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "first_k_dense_replace": 1,
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "max_position_embeddings": 202752,
    "vocab_size": 154880,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
OLMOE = {  # allenai/OLMoE-1B-7B-0924: q and k normed over all their heads
    "architectures": ["OlmoeForCausalLM"],
    "model_type": "olmoe",
    "hidden_size": 2048,
    "intermediate_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 16,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 4096,
    "vocab_size": 50304,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
APERTUS_8B = {  # swiss-ai/Apertus-8B-2509: an xIELU MLP of up and down projections
    "architectures": ["ApertusForCausalLM"],
    "model_type": "apertus",
    "hidden_size": 4096,
    "intermediate_size": 21504,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 65536,
    "vocab_size": 131072,
    "hidden_act": "xielu",
    "qk_norm": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
GLM4_9B_CHAT = {  # THUDM/glm-4-9b-chat: ChatGLM's vocabulary as padded_vocab_size only
    **{key: value for key, value in CHATGLM3.items() if key != "vocab_size"},
    "num_layers": 40,
    "padded_vocab_size": 151552,
    "seq_length": 131072,
    "rope_ratio": 500,
    "torch_dtype": "bfloat16",
}


PHI35_MOE = {  # microsoft/Phi-3.5-MoE-instruct
    "architectures": ["PhiMoEForCausalLM"],
    "model_type": "phimoe",
    "hidden_size": 4096,
    "intermediate_size": 6400,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "num_local_experts": 16,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 131072,
    "sliding_window": 131072,
    "attention_bias": True,
    "lm_head_bias": True,
    "vocab_size": 32064,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


ERNIE45_21B = {  # baidu/ERNIE-4.5-21B-A3B-PT: its experts under moe_* names
    "architectures": ["Ernie4_5_MoeForCausalLM"],
    "model_type": "ernie4_5_moe",
    "hidden_size": 2560,
    "intermediate_size": 12288,
    "num_attention_heads": 20,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 28,
    "max_position_embeddings": 131072,
    "vocab_size": 103424,
    "moe_num_experts": 64,
    "moe_k": 6,
    "moe_intermediate_size": 1536,
    "moe_num_shared_experts": 2,
    "moe_layer_start_index": 1,
    "moe_layer_end_index": 27,
    "moe_layer_interval": 1,
    "use_bias": False,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


HUNYUAN_A13B = {  # tencent/Hunyuan-A13B-Instruct: per-layer lists, which transformers' HunYuanMoEV1Config allows
    "architectures": ["HunYuanMoEV1ForCausalLM"],
    "model_type": "hunyuan_v1_moe",
    "hidden_size": 4096,
    "intermediate_size": 3072,
    "moe_intermediate_size": [3072] * 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_head_dim": 128,
    "num_hidden_layers": 32,
    "num_experts": 64,
    "moe_topk": [8] * 32,
    "num_shared_expert": [1] * 32,
    "use_mixed_mlp_moe": True,
    "use_qk_norm": True,
    "max_position_embeddings": 32768,
    "vocab_size": 128167,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


GLM4_9B_0414 = {  # THUDM/GLM-4-9B-0414
    "architectures": ["Glm4ForCausalLM"],
    "model_type": "glm4",
    "hidden_size": 4096,
    "intermediate_size": 13696,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "num_hidden_layers": 40,
    "max_position_embeddings": 32768,
    "partial_rotary_factor": 0.5,
    "attention_bias": True,
    "vocab_size": 151552,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
STABLELM2 = {  # stabilityai/stablelm-2-1_6b
    "architectures": ["StableLmForCausalLM"],
    "model_type": "stablelm",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 24,
    "max_position_embeddings": 4096,
    "partial_rotary_factor": 0.25,
    "use_qkv_bias": True,
    "vocab_size": 100352,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


# (config, kvops' count before, the count now: vLLM's loaded parameters, the published figure where it is the same)
COUNTS = {
    "gpt2": (GPT2, 190_460_160, 124_439_808),  # the model card's 124,439,808
    "gpt-j-6b": (GPT_J, 7_929_303_040, 6_050_882_784),
    "gpt-neox-20b": (GPT_NEOX_20B, 27_195_365_376, 20_554_567_680),  # the paper's 20,554,567,680
    "starcoder": (STARCODER, 21_806_684_160, 15_517_456_384),
    "bloom-7b1": (BLOOM_7B1, 10_108_522_496, 7_069_016_064),  # the model card's 7,069,016,064
    "falcon-7b": (FALCON_7B, 9_860_121_024, 6_921_720_704),
    "falcon-40b": (FALCON_40B, 57_941_106_688, 41_303_293_952),
    "nemotron-mini-4b": (NEMOTRON_MINI, 5_096_279_040, 4_190_509_056),
    "chatglm3-6b": (CHATGLM3, 7_168_299_008, 6_243_584_000),
    # Step3's 48 experts (moe_num_experts) in moe_layers_enum's 56 layers, its shared expert (share_expert_dim)
    # and its q through share_q_dim: kvops counted a dense model (step3_text.py); the whole Step3 with its
    # vision tower is 321B (its model card)
    "step3": (STEP3_TEXT, 54_681_123_840, 316_294_538_240),
    # exaone4.py and olmoe.py norm q and k (per head, and over all heads); kvops left the norms out
    "exaone4-32b": (EXAONE4_32B, None, 32_003_216_384),  # kvops refused the config (below)
    "olmoe": (OLMOE, 6_919_096_320, 6_919_161_856),
    # commandr.py: one input_layernorm a layer (attention and MLP in parallel); kvops counted two
    "command-r7b": (COMMAND_R7B, 8_028_164_096, 8_028_033_024),
    # chatglm.py embeds padded_vocab_size rows; kvops read no vocabulary and a 4 x hidden MLP
    "glm-4-9b-chat": (GLM4_9B_CHAT, 9_479_458_816, 9_399_951_360),
    "glm-4.7-flash": (GLM_47_FLASH, None, 29_943_393_920),  # kvops refused the config (below)
    # apertus.py: ApertusMLP is up_proj and down_proj around xIELU (its alpha_p and alpha_n), q and k normed per
    # head; kvops counted a SwiGLU MLP: 10,871,902,208. vLLM cannot build it on the meta device (XIELU computes
    # its parameters from tensors), so this figure is read from apertus.py, not measured
    "apertus-8b": (APERTUS_8B, 10_871_902_208, 8_053_338_176),
    # phimoe.py: LayerNorms (with biases), an o_proj bias and a head bias; kvops counted RMSNorms and neither
    "phi-3.5-moe": (PHI35_MOE, 41_872_723_968, 41_873_153_344),
    # ernie45_moe.py: moe_num_experts (64) of moe_k in layers 1-27, moe_num_shared_experts, a correction bias per
    # expert; kvops counted a dense 3.3B model of its 21.8B (6.5x under)
    "ernie-4.5-21b-a3b": (ERNIE45_21B, 3_347_724_800, 21_825_437_888),
    # kvops refused the config ("'moe_intermediate_size' is a list of 32"); vLLM runs it on transformers'
    # modeling_hunyuan_v1_moe.py: 64 experts and one shared MLP of intermediate_size, q and k normed per head
    "hunyuan-a13b": (HUNYUAN_A13B, None, 80_393_183_232),
    # glm4.py: post_self_attn_layernorm and post_mlp_layernorm beside the two pre-norms; kvops counted two a layer
    "glm-4-9b-0414": (GLM4_9B_0414, 9_399_951_360, 9_400_279_040),
    # stablelm.py: LayerNorms (with biases) and q, k, v biases (use_qkv_bias); kvops counted RMSNorms, no biases
    "stablelm-2-1.6b": (STABLELM2, 1_644_267_520, 1_644_515_328),
    # step3p5.py: Step3's expert names, 96 query heads on the sliding layers (attention_other_setting), a head-wise
    # gate (g_proj), q/k norms and a router bias; kvops counted a dense model of 64 heads
    "step-3.5": (STEP35, 13_324_627_968, 196_956_130_368),
}
UNBUILDABLE_ON_META = ("bloom-7b1", "apertus-8b")


@pytest.mark.parametrize("name", list(COUNTS))
def test_parameter_count(name, tmp_path):
    """For the GPT-style families kvops counted a SwiGLU MLP of 3 matrices (of 4 x hidden where the width is named
    n_inner, ffn_hidden_size or nothing), RMSNorms, no biases and an untied head: 15-53% over what vLLM loads."""
    from kvops.model.locate import load_model

    config, _, count = COUNTS[name]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(str(tmp_path)).parameters == count


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba", "mamba2"])
def test_attention_free_mamba_is_one_line(model_type, run_kvops, tmp_path):
    # kvops said "missing 'num_attention_heads', which the KV formula needs" of a model vLLM serves (mamba.py)
    config = {"architectures": ["MambaForCausalLM"], "model_type": model_type, "hidden_size": 4096}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 64, "vocab_size": 65024}))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "attention-free Mamba models" in ran.stderr


def _loaded_parameters(vllm_config: Any) -> int:
    """The parameters of vLLM's model built on the meta device, each once (a tied head is the embedding), less the
    rows VocabParallelEmbedding pads the vocabulary to."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.model_executor.model_loader.utils import initialize_model

    with set_current_vllm_config(vllm_config), torch.device("meta"):
        model = initialize_model(vllm_config=vllm_config)
    padding = {}
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):
            rows = module.num_embeddings_padded - module.org_vocab_size
            for tensor in (module.weight, getattr(module, "bias", None)):
                if tensor is not None:
                    padding[id(tensor)] = rows * (tensor.numel() // tensor.shape[0])
    sizes = {id(tensor): tensor.numel() for tensor in model.parameters()}
    return sum(size - padding.get(key, 0) for key, size in sizes.items())


def _built(config: dict, tmp_path: Path, tiny_model: Path, monkeypatch, **engine_args: Any):
    from tests.support.vllm_specs import BuiltModel

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    built = BuiltModel(config, tmp_path / "vllm", tiny_model, max_num_batched_tokens=2048, **engine_args)
    built.as_gpu(16)
    return built


def _spec(config: dict, tmp_path: Path):
    from kvops.model.locate import load_model

    (tmp_path / "kvops").mkdir()
    (tmp_path / "kvops" / "config.json").write_text(json.dumps(config))
    return load_model(str(tmp_path / "kvops"))


@pytest.mark.parametrize(
    ("config", "refusal"),
    [
        (EXAONE4_32B, "'sliding_window_pattern' is 'LLLG' (a string)"),
        (GLM_47_FLASH, "no head_dim and hidden_size 2048 is not divisible by num_attention_heads 20"),
    ],
    ids=["exaone4", "glm-4.7-flash"],
)
def test_configs_kvops_refused_vllm_serves(config, refusal, run_kvops, tmp_path):
    """kvops refused both with the line quoted; vLLM serves them: EXAONE 4's layers come from layer_types (its
    letters, L sliding and G global, say the same), GLM-4.7-Flash's MLA cache needs no head_dim (transformers'
    Glm4MoeLiteConfig maps head_dim to qk_rope_head_dim)."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", "--json")
    assert refusal not in ran.stderr
    layers = {group["kind"]: group["layers"] for group in json.loads(ran.stdout)["layer_groups"]}
    assert layers == ({"full": 16, "sliding": 48} if config is EXAONE4_32B else {"mla": 47})


def test_exaone4_letters_alone_give_the_layers(run_kvops, tmp_path):
    letters = {key: value for key, value in EXAONE4_32B.items() if key != "layer_types"}
    (tmp_path / "config.json").write_text(json.dumps(letters))
    kv = json.loads(run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", "--json").stdout)
    assert {group["kind"]: group["layers"] for group in kv["layer_groups"]} == {"full": 16, "sliding": 48}


def test_zamba2_is_one_line(run_kvops, tmp_path):
    # zamba2.py builds a Mamba-2 mixer in each of the 54 layers and its shared attention (2 x hidden wide,
    # attention_head_dim 160) on the 9 hybrid_layer_ids; kvops read 54 attention layers of head_dim 80 (552,960 B
    # a token where vLLM caches 184,320 and 54 states). transformers' Zamba2Config defaults (Zyphra/Zamba2-2.7B)
    config = {"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "hidden_size": 2560}
    config |= {"num_hidden_layers": 54, "num_attention_heads": 32, "attention_head_dim": 160, "vocab_size": 32000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "Zamba2's layers" in ran.stderr


def test_longcat_flash_is_one_line(run_kvops, tmp_path):
    # longcat_flash.py builds two MLA attentions in each of num_layers blocks (56 caches of 28 blocks); kvops read
    # 28 layers and then refused for "moe_intermediate_size or intermediate_size"
    config = {"architectures": ["LongcatFlashForCausalLM"], "model_type": "longcat_flash", "hidden_size": 6144}
    config |= {"num_layers": 28, "num_attention_heads": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_routed_experts": 512, "vocab_size": 131072}))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "LongCat-Flash's blocks" in ran.stderr


@pytest.mark.vllm
@pytest.mark.parametrize(
    "config",
    [STEP3_TEXT, STEP35, MINICPM3, COMMAND_R7B, EXAONE4_32B, GLM_47_FLASH],
    ids=["step3", "step3.5", "minicpm3", "command-r7b", "exaone4", "glm-4.7-flash"],
)
def test_attention_pages_windows_and_context_match_vllm(config, tiny_model, tmp_path, monkeypatch):
    """Each layer's page at block 16 and its window, and the context, as vLLM builds them."""
    from kvops.dtypes import KV_DTYPES
    from kvops.engines.vllm import context

    built = _built(config, tmp_path, tiny_model, monkeypatch)
    theirs = sorted(
        (spec.page_size_bytes, getattr(spec, "sliding_window", None) or 0) for spec in built.specs().values()
    )
    spec = _spec(config, tmp_path)
    bf16 = KV_DTYPES["bf16"]
    ours = sorted((16 * layer.bytes_per_token(bf16, 1), getattr(layer, "window", 0)) for layer in spec.layers)
    assert ours == theirs
    assert built.vllm_config.model_config.max_model_len == context.model_default(spec)


@pytest.mark.vllm
def test_lfm2_pool_matches_vllm(tiny_model, tmp_path, monkeypatch):
    """6 attention pages and 10 short-convolution states, unified as vLLM pads them: its pool, block for block."""
    from kvops.dtypes import KV_DTYPES
    from kvops.engines.vllm.layout import kv_layout, pool
    from tests.support.vllm_specs import vllm_pool

    memory = 3 * 2**30 + 12345
    built = _built(LFM2, tmp_path, tiny_model, monkeypatch, max_model_len=4096)
    blocks, tokens, _ = vllm_pool(built.vllm_config, built.specs(), memory)
    in_flight = built.vllm_config.max_in_flight_tokens
    ours = pool(kv_layout(_spec(LFM2, tmp_path), KV_DTYPES["bf16"], 1, 16), memory, 4096, in_flight)
    assert (ours.num_blocks, ours.kv_cache_size_tokens) == (blocks, tokens) == (16384, 258111)


@pytest.mark.vllm
@pytest.mark.parametrize("name", [name for name in COUNTS if name not in UNBUILDABLE_ON_META])
def test_parameter_count_matches_what_vllm_loads(name, tiny_model, tmp_path, monkeypatch):
    # BLOOM's ALiBi slopes and Apertus' xIELU are computed from tensors, which the meta device cannot give
    from tests.support.vllm_specs import engine_config

    config, _, count = COUNTS[name]
    _built(config, tmp_path, tiny_model, monkeypatch)  # the process group; its model's layers are registered
    fresh = engine_config(config, tmp_path / "count", tiny_model, max_num_batched_tokens=2048)
    assert _loaded_parameters(fresh) == count
