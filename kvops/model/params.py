"""Parameter count from a config's architecture, for configs the catalog has no published count for.

Counts the weight matrices of a decoder-only transformer: embeddings, attention (GQA or MLA), dense or MoE
MLP (routed experts, shared experts, router and its correction bias), norms and the LM head. Small terms that
vary by family (biases, q/k norms, attention sinks) are included where the config says they exist. Beside the
language model it counts what a checkpoint stores and a text-only engine may not load: multi-token-prediction
(MTP) layers and a vision tower (SigLIP, Pixtral). A published count (the catalog's) wins over the language
model's count for the weights; the parts are kept apart so an engine can leave out what it does not load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParameterCount:
    total: int  # the language model an engine loads for text generation (MTP and vision towers apart)
    experts: int  # inside routed experts
    num_experts: int
    mtp: int = 0  # multi-token-prediction layers the checkpoint stores (vLLM loads them only to speculate)
    vision: int = 0  # vision tower and projector, when its architecture is counted
    embeddings: int = 0  # the token embedding matrix (vocab x hidden)

    @property
    def checkpoint(self) -> int:
        """Every parameter the checkpoint stores, as far as it is counted."""
        return self.total + self.mtp + self.vision


def count_parameters(
    text: dict[str, Any],
    *,
    num_layers: int,
    hidden: int,
    num_heads: int,
    kv_heads: int,
    head_dim: int,
    wrapper: dict[str, Any] | None = None,
) -> ParameterCount:
    """`text` is the language model's config (text_config merged), `wrapper` the whole config.json."""
    shape = _Shape(text, hidden, num_heads, kv_heads, head_dim)
    vocab = int(text.get("vocab_size") or 0)
    embed_dim = int(text.get("word_embed_proj_dim") or hidden)
    embeddings = vocab * embed_dim
    if embed_dim != hidden:  # OPT-350m style projections in and out
        embeddings += 2 * embed_dim * hidden
    if shape.model_type == "opt":
        embeddings += (int(text.get("max_position_embeddings") or 0) + 2) * hidden  # learned positions, offset 2
    lm_head = 0 if text.get("tie_word_embeddings", shape.model_type in _TIED_BY_DEFAULT) else vocab * embed_dim

    dense_layers = int(text.get("first_k_dense_replace") or 0) if shape.num_experts else num_layers
    layers = sum(shape.decoder_layer(moe=index >= dense_layers) for index in range(num_layers))
    experts = (num_layers - dense_layers) * shape.routed_experts() if shape.num_experts else 0
    final_norm = 2 * hidden if shape.model_type == "opt" else hidden  # OPT's LayerNorm has a bias
    total = embeddings + lm_head + layers + final_norm
    mtp_layers = int(text.get("num_nextn_predict_layers") or 0)
    mtp = mtp_layers * _mtp_module(shape, vocab) if mtp_layers else 0
    return ParameterCount(
        total=total,
        experts=experts,
        num_experts=shape.num_experts,
        mtp=mtp,
        vision=vision_parameters(wrapper or {}),
        embeddings=vocab * embed_dim,
    )


_TIED_BY_DEFAULT = {"opt", "gemma", "gemma2", "gemma3", "gemma3_text"}
_QK_NORM_PER_HEAD = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}  # one head_dim-wide norm for q and one for k


class _Shape:
    """The per-layer pieces of one architecture."""

    def __init__(self, text: dict, hidden: int, num_heads: int, kv_heads: int, head_dim: int):
        self.text = text
        self.model_type = str(text.get("model_type") or "")
        self.hidden = hidden
        self.num_heads = num_heads
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.num_experts = int(
            text.get("n_routed_experts") or text.get("num_local_experts") or text.get("num_experts") or 0
        )

    def decoder_layer(self, moe: bool) -> int:
        return self.attention() + self.norms() + (self.moe_mlp() if moe else self.dense_mlp())

    def attention(self) -> int:
        if self.text.get("kv_lora_rank"):
            return _mla_attention(self.text, self.hidden, self.num_heads)
        return _gqa_attention(self.text, self.hidden, self.num_heads, self.kv_heads, self.head_dim) + self.qk_norms()

    def qk_norms(self) -> int:
        if self.model_type in _QK_NORM_PER_HEAD or (self.model_type == "glm4_moe" and self.text.get("use_qk_norm")):
            return 2 * self.head_dim
        if self.text.get("qk_norm_type") == "per_layer" and self.text.get("use_qk_norm"):  # MiniMax-M2
            return (self.num_heads + self.kv_heads) * self.head_dim
        return 0

    def norms(self) -> int:
        if self.model_type == "opt":
            return 4 * self.hidden  # two LayerNorms with bias
        if self.model_type in {"gemma2", "gemma3", "gemma3_text"}:
            return 4 * self.hidden  # pre and post norms around attention and MLP
        if self.model_type == "cohere":
            return self.hidden  # one LayerNorm (no bias) before the parallel attention and MLP
        return 2 * self.hidden

    def dense_mlp(self) -> int:
        if self.model_type == "opt":
            ffn = int(self.text["ffn_dim"])
            return 2 * self.hidden * ffn + ffn + self.hidden
        inter = int(self.text.get("intermediate_size") or 4 * self.hidden)
        return 3 * self.hidden * inter  # gate, up and down projections

    def expert_intermediate(self) -> int:
        return int(self.text.get("moe_intermediate_size") or self.text.get("intermediate_size"))

    def routed_experts(self) -> int:
        inter = self.expert_intermediate()
        per_expert = 3 * self.hidden * inter + (2 * inter + self.hidden if self.model_type == "gpt_oss" else 0)
        return self.num_experts * per_expert

    def moe_mlp(self) -> int:
        """Routed experts, the router (with its bias or correction bias) and shared experts of one MoE layer."""
        router = self.hidden * self.num_experts
        if self.model_type == "gpt_oss" or self.text.get("use_routing_bias") or self._correction_bias():
            router += self.num_experts
        shared = int(self.text.get("n_shared_experts") or 0) * 3 * self.hidden * self.expert_intermediate()
        return self.routed_experts() + router + shared

    def _correction_bias(self) -> bool:
        """DeepSeek-V3's noaux_tc routing (also GLM-4.5) keeps an e_score_correction_bias per expert."""
        return self.text.get("topk_method") == "noaux_tc" or self.model_type == "glm4_moe"


def _mtp_module(shape: _Shape, vocab: int) -> int:
    """One DeepSeek-style MTP module as checkpoints store it: a MoE decoder layer, the embedding and hidden norms,
    the projection of both into one hidden state, the shared head's norm, and copies of the embeddings and head."""
    hidden = shape.hidden
    return shape.decoder_layer(moe=True) + 2 * hidden + 2 * hidden * hidden + hidden + 2 * vocab * hidden


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


# --- vision towers ----------------------------------------------------------------------------------------


def vision_parameters(wrapper: dict[str, Any]) -> int:
    """The vision tower and its projector, for the towers counted here (0 for others or none)."""
    vision = wrapper.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    text_hidden = int((wrapper.get("text_config") or {}).get("hidden_size") or 0)
    counter = _VISION_TOWERS.get(str(vision.get("model_type") or ""))
    return counter(wrapper, vision, text_hidden) if counter else 0


def _siglip(wrapper: dict, vision: dict, text_hidden: int) -> int:
    """SigLIP encoder (Gemma 3): patch convolution, learned positions, pre-norm layers with biased projections,
    a post-norm; Gemma 3's projector is one matrix to the text width and a soft-embedding norm."""
    width, inter = int(vision["hidden_size"]), int(vision["intermediate_size"])
    patch, channels = int(vision["patch_size"]), int(vision.get("num_channels") or 3)
    positions = (int(vision["image_size"]) // patch) ** 2
    embeddings = channels * patch * patch * width + width + positions * width
    layer = 2 * 2 * width + 4 * (width * width + width) + (width * inter + inter) + (inter * width + width)
    tower = embeddings + int(vision["num_hidden_layers"]) * layer + 2 * width
    return tower + width * text_hidden + width


def _pixtral(wrapper: dict, vision: dict, text_hidden: int) -> int:
    """Pixtral encoder (Mistral 3): bias-free patch convolution, a pre-norm, RMS-normed layers of bias-free
    attention and gated MLP; Mistral 3's projector: a norm, the patch merger and a two-layer MLP."""
    width, inter = int(vision["hidden_size"]), int(vision["intermediate_size"])
    patch, channels = int(vision["patch_size"]), int(vision.get("num_channels") or 3)
    layer = 2 * width + 4 * width * width + 3 * width * inter
    tower = channels * patch * patch * width + width + int(vision["num_hidden_layers"]) * layer
    merge = int(wrapper.get("spatial_merge_size") or 2)
    bias = bool(wrapper.get("multimodal_projector_bias"))
    projector = width + merge * merge * width * width + width * text_hidden + text_hidden * text_hidden
    if bias:
        projector += 2 * text_hidden
    return tower + projector


_VISION_TOWERS = {"siglip_vision_model": _siglip, "pixtral": _pixtral}
