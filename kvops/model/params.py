"""Parameter count from a config's architecture, for configs the catalog has no published count for.

Counts the weight matrices of a decoder-only transformer: embeddings, attention (GQA or MLA), dense or MoE
MLP, norms and the LM head. Small terms that vary by family (biases, rotary tables, attention sinks) are
included where the config says they exist. A published count (the catalog's) always wins over this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParameterCount:
    total: int
    experts: int  # inside routed experts
    num_experts: int


def count_parameters(
    text: dict[str, Any], *, num_layers: int, hidden: int, num_heads: int, kv_heads: int, head_dim: int
) -> ParameterCount:
    vocab = int(text.get("vocab_size") or 0)
    embed_dim = int(text.get("word_embed_proj_dim") or hidden)
    embeddings = vocab * embed_dim
    if embed_dim != hidden:  # OPT-350m style projections in and out
        embeddings += 2 * embed_dim * hidden
    if text.get("model_type") == "opt":
        embeddings += (int(text.get("max_position_embeddings") or 0) + 2) * hidden  # learned positions, offset 2
    lm_head = 0 if text.get("tie_word_embeddings", text.get("model_type") in _TIED_BY_DEFAULT) else vocab * embed_dim

    attention = (
        _mla_attention(text, hidden, num_heads)
        if text.get("kv_lora_rank")
        else _gqa_attention(text, hidden, num_heads, kv_heads, head_dim)
    )
    num_experts = int(text.get("n_routed_experts") or text.get("num_local_experts") or text.get("num_experts") or 0)
    dense_mlp = _dense_mlp(text, hidden)
    norms = _norms_per_layer(text, hidden, head_dim)

    expert_total = 0
    mlp_total = 0
    if num_experts:
        moe_dense_layers = int(text.get("first_k_dense_replace") or 0)
        moe_layers = num_layers - moe_dense_layers
        moe_inter = int(text.get("moe_intermediate_size") or text.get("intermediate_size"))
        per_expert = 3 * hidden * moe_inter + (2 * moe_inter + hidden if text.get("model_type") == "gpt_oss" else 0)
        router = hidden * num_experts + (num_experts if text.get("model_type") == "gpt_oss" else 0)
        shared = int(text.get("n_shared_experts") or 0) * 3 * hidden * moe_inter
        expert_total = moe_layers * num_experts * per_expert
        mlp_total = moe_dense_layers * dense_mlp + moe_layers * (router + shared)
    else:
        mlp_total = num_layers * dense_mlp

    final_norm = 2 * hidden if text.get("model_type") == "opt" else hidden  # OPT's LayerNorm has a bias
    total = embeddings + lm_head + num_layers * (attention + norms) + mlp_total + expert_total + final_norm
    return ParameterCount(total=total, experts=expert_total, num_experts=num_experts)


_TIED_BY_DEFAULT = {"opt", "gemma", "gemma2", "gemma3", "gemma3_text"}


def _gqa_attention(text: dict, hidden: int, num_heads: int, kv_heads: int, head_dim: int) -> int:
    q = hidden * num_heads * head_dim
    kv = 2 * hidden * kv_heads * head_dim
    out = num_heads * head_dim * hidden
    bias = 0
    if text.get("attention_bias") or text.get("model_type") in {"qwen2", "opt", "gpt_oss"}:
        bias = num_heads * head_dim + 2 * kv_heads * head_dim
        if text.get("model_type") in {"opt", "gpt_oss"}:
            bias += hidden  # output projection bias
    sinks = num_heads if text.get("model_type") == "gpt_oss" else 0
    return q + kv + out + bias + sinks


def _mla_attention(text: dict, hidden: int, num_heads: int) -> int:
    rope = int(text["qk_rope_head_dim"])
    nope = int(text.get("qk_nope_head_dim") or 0)
    v_dim = int(text.get("v_head_dim") or nope)
    kv_rank = int(text["kv_lora_rank"])
    q_rank = text.get("q_lora_rank")
    q_head = num_heads * (nope + rope)
    q = hidden * int(q_rank) + int(q_rank) + int(q_rank) * q_head if q_rank else hidden * q_head
    kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * num_heads * (nope + v_dim)
    out = num_heads * v_dim * hidden
    return q + kv + out


def _dense_mlp(text: dict, hidden: int) -> int:
    if text.get("model_type") == "opt":
        ffn = int(text["ffn_dim"])
        return 2 * hidden * ffn + ffn + hidden
    inter = int(text.get("intermediate_size") or 4 * hidden)
    return 3 * hidden * inter  # gate, up and down projections


def _norms_per_layer(text: dict, hidden: int, head_dim: int) -> int:
    model_type = text.get("model_type")
    if model_type == "opt":
        return 4 * hidden  # two LayerNorms with bias
    if model_type in {"gemma2", "gemma3", "gemma3_text"}:
        extra = 2 * head_dim if model_type != "gemma2" else 0  # Gemma 3 q/k norms
        return 4 * hidden + extra
    if model_type in {"qwen3", "qwen3_moe"}:
        return 2 * hidden + 2 * head_dim  # q/k norms
    return 2 * hidden
