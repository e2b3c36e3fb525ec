"""Parameter count from a config's architecture, for configs the catalog has no published count for.

Counts the weight matrices of a decoder-only transformer: embeddings, attention (GQA or MLA), dense or MoE
MLP (routed experts, shared experts, router and its correction bias), norms and the LM head. Small terms that
vary by family (biases, q/k norms, attention sinks) are included where the config says they exist. Beside the
language model it counts what a checkpoint stores and a text-only engine may not load: multi-token-prediction
(MTP) layers and a vision tower (SigLIP, Pixtral). A published count (the catalog's) wins over the language
model's count for the weights; the parts are kept apart so an engine can leave out what it does not load.
"""

from __future__ import annotations

from typing import Any

from kvops.errors import ConfigError
from kvops.frozen import frozen
from kvops.model.spec import (
    CacheKind,
    Mamba1State,
    MambaState,
    ParameterCount,
    ShortConvState,
    SlidingWindow,
    StateKind,
)


@frozen
class PublishedCount:
    """A checkpoint's published parameter count, and what it holds besides (or without) the counted parts."""

    total: int
    stores_tied_head: bool = False  # lm_head.weight is stored although tied to the embeddings
    without_mtp: bool = False  # the figure is of a port that leaves the MTP layers out

    def loaded(self, counted: ParameterCount) -> int:
        """What an engine loads to generate text: the figure without MTP layers and without a tied copy."""
        return (
            self.total - (0 if self.without_mtp else counted.mtp) - (counted.embeddings if self.stores_tied_head else 0)
        )

    def expected(self, counted: ParameterCount) -> int:
        """What the count says this figure should be."""
        return (
            counted.checkpoint
            - (counted.mtp if self.without_mtp else 0)
            + (counted.embeddings if self.stores_tied_head else 0)
        )


def count_parameters(
    text: dict[str, Any],
    *,
    num_layers: int,
    hidden: int,
    num_heads: int,
    kv_heads: int,
    head_dim: int,
    wrapper: dict[str, Any] | None = None,
    layers: tuple[CacheKind, ...] = (),
    beside: StateKind | None = None,
) -> ParameterCount:
    """`text` is the language model's config (text_config merged), `wrapper` the whole config.json, `layers` each
    layer's cache kind (which mixer it has: attention, a recurrent state, or none), `beside` a recurrent mixer every
    layer runs beside its attention (Falcon-H1)."""
    shape = _Shape(text, hidden, num_heads, kv_heads, head_dim, beside)
    vocab = vocabulary(text)
    embed_dim = int(text.get("word_embed_proj_dim") or hidden)
    embeddings = vocab * embed_dim
    if embed_dim != hidden:  # OPT-350m style projections in and out
        embeddings += 2 * embed_dim * hidden
    if shape.model_type == "opt":
        embeddings += (int(text.get("max_position_embeddings") or 0) + 2) * hidden  # learned positions, offset 2
    if shape.model_type in _LEARNED_POSITIONS:
        embeddings += int(text.get("n_positions") or text.get("max_position_embeddings") or 0) * hidden
    if shape.model_type == "bloom":  # word_embeddings_layernorm
        embeddings += 2 * hidden
    lm_head = 0 if text.get("tie_word_embeddings", shape.model_type in _TIED_BY_DEFAULT) else vocab * embed_dim
    if lm_head and shape.model_type in _LM_HEAD_BIAS:
        lm_head += vocab

    kinds = layers or (None,) * num_layers
    per_layer = tuple(shape.decoder_layer(index, kind) for index, kind in enumerate(kinds))
    layer_experts = tuple(
        shape.routed_experts() if shape.mlp_kind(index) == "moe" else 0 for index in range(num_layers)
    )
    blocks, experts = sum(per_layer), sum(layer_experts)
    final_norm = 2 * hidden if shape.model_type in _LAYER_NORM else hidden  # a LayerNorm has a bias
    total = embeddings + lm_head + blocks + final_norm + _per_layer_embeddings(text, hidden, num_layers)
    total += _altup_projections(text, hidden)
    return ParameterCount(
        total=total,
        experts=experts,
        num_experts=shape.num_experts,
        mtp=_mtp(shape, vocab, kinds),
        vision=vision_parameters(wrapper or {}),
        embeddings=vocab * embed_dim,
        lm_head=lm_head,
        layers=per_layer,
        layer_experts=layer_experts,
    )


def vocabulary(text: dict[str, Any]) -> int:
    """The embedding rows: ChatGLM's padded_vocab_size where it names one (chatglm.py builds its embedding and head
    of it; GLM-4-9B-Chat names no vocab_size), else vocab_size."""
    return int(text.get("padded_vocab_size") or text.get("vocab_size") or 0)


def _altup_projections(text: dict[str, Any], hidden: int) -> int:
    """Gemma 3n's AltUp projections into and out of its altup_num_inputs - 1 extra streams (gemma3n.py
    altup_projections, altup_unembed_projections: hidden x hidden each)."""
    if text.get("model_type") != "gemma3n_text":
        return 0
    return 2 * (_field(text, "altup_num_inputs") - 1) * hidden * hidden


def _per_layer_embeddings(text: dict[str, Any], hidden: int, num_layers: int) -> int:
    """Gemma 3n / Gemma 4 E-series per-layer embeddings (PLE): a second embedding table of
    vocab_size_per_layer_input x (layers x hidden_size_per_layer_input), its projection from the hidden state and
    norm, and in every layer a gate (hidden -> ple), a projection (ple -> hidden) and a norm
    (vllm/model_executor/models/gemma4.py l.1045-1062: embed_tokens_per_layer, per_layer_model_projection,
    per_layer_projection_norm; l.704-722: per_layer_input_gate, per_layer_projection, post_per_layer_input_norm,
    0.34.0 wheel). 262,144 x 42 x 256 = 2.8B parameters for gemma-4-E4B: a third of its checkpoint."""
    ple = int(text.get("hidden_size_per_layer_input") or 0)
    vocab = int(text.get("vocab_size_per_layer_input") or 0)
    if not ple or not vocab:
        return 0
    table = vocab * num_layers * ple
    model_projection = hidden * num_layers * ple + ple
    per_layer = num_layers * (2 * hidden * ple + hidden)
    return table + model_projection + per_layer


def _mtp(shape: _Shape, vocab: int, kinds: tuple) -> int:
    """Multi-token-prediction modules: DeepSeek's (num_nextn_predict_layers) store a full MoE layer with its
    own embedding and head copies; Qwen3.5's (mtp_num_hidden_layers) a full-attention MoE layer, a projection
    of the embedding and hidden state, and their norms."""
    hidden = shape.hidden
    if shape.text.get("mtp_hybrid_override_pattern"):  # Nemotron-H: its MTP blocks follow their own pattern
        attention = next((kind for kind in kinds if kind is not None and kind.kind == "full"), None)
        mtp_pattern = str(shape.text["mtp_hybrid_override_pattern"])
        blocks = sum(
            shape.decoder_layer(0, attention if char == "*" else None, _PATTERN_MLP.get(char, "none"))
            for char in mtp_pattern
            if char in "*E-"
        )
        return int(shape.text.get("num_nextn_predict_layers") or 1) * (blocks + 2 * hidden * hidden + 3 * hidden)
    if nextn := int(shape.text.get("num_nextn_predict_layers") or 0):
        return nextn * _mtp_module(shape, vocab)
    if qwen := int(shape.text.get("mtp_num_hidden_layers") or 0):
        attention = next((kind for kind in kinds if kind is not None and kind.kind == "full"), None)
        layer = shape.decoder_layer(len(kinds), attention, mlp="moe" if shape.num_experts else "dense")
        return qwen * (layer + 2 * hidden * hidden + 3 * hidden)
    return 0


# tie_word_embeddings unset: transformers' configuration classes tie these (GPT-2, StarCoder, BLOOM, Falcon keep
# PretrainedConfig's True)
_TIED_BY_DEFAULT = {
    *("opt", "gemma", "gemma2", "gemma3", "gemma3_text", "gemma4_text"),
    *("gpt2", "gpt_bigcode", "bloom", "falcon"),
}
# The GPT-style families (vllm/model_executor/models/gpt2.py, gpt_j.py, gpt_neox.py, bloom.py, falcon.py,
# nemotron.py; GPTBigCode through transformers' modeling_gpt_bigcode.py): LayerNorms, a two-matrix MLP
_GPT_STYLE = {"gpt2", "gptj", "gpt_neox", "gpt_bigcode", "bloom", "falcon", "nemotron"}
# Families whose modules carry biases the config does not flag (attention_bias / mlp_bias absent or false):
_QKV_BIAS = {
    "qwen2",
    "qwen2_moe",
    "opt",
    "gpt_oss",
    "phi",
    "phimoe",
    "gpt2",
    "gpt_neox",
    "gpt_bigcode",
    "bloom",
}  # q, k, v
_OUT_BIAS = {"opt", "gpt_oss", "phi", "phimoe", "gpt2", "gpt_neox", "gpt_bigcode", "bloom"}  # the attention output
_LM_HEAD_BIAS = {
    "phi",
    "phimoe",
    "gptj",
}  # phimoe.py: biases on qkv, o_proj and the head, LayerNorms  # an untied head with a bias per vocabulary entry
# LayerNorm (weight and bias) instead of RMSNorm; a plain two-matrix MLP (fc1, fc2) instead of SwiGLU, with its
# biases except where the config turns them off (Falcon's bias, Nemotron's mlp_bias)
_LAYER_NORM = {"opt", "phi", "phimoe", "stablelm"} | _GPT_STYLE  # stablelm.py: nn.LayerNorm
_PLAIN_MLP = {"opt", "phi"} | _GPT_STYLE
_UNBIASED_MLP = {"falcon", "nemotron"}
# learned absolute positions of n_positions x hidden (GPT-2, StarCoder)
_LEARNED_POSITIONS = {"gpt2", "gpt_bigcode"}
# One norm per block: Cohere, Phi-2 and GPT-J run attention and MLP in parallel on the same normed input,
# Nemotron-H's blocks hold one mixer each
_ONE_NORM_PER_BLOCK = {"cohere", "cohere2", "cohere2_moe", "nemotron_h", "phi", "gptj"}
# one head_dim-wide norm for q and one for k
_QK_NORM_PER_HEAD = {
    *("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "gemma3n_text", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"),
    "gemma4_text",  # vllm/model_executor/models/gemma4.py q_norm, k_norm of the layer's head_dim
    "exaone4",  # vllm/model_executor/models/exaone4.py q_norm, k_norm of head_dim
}
# one norm over all query heads and one over all key heads (vllm/model_executor/models/olmoe.py; OLMo 2 and 3)
_QK_NORM_PER_LAYER = {"olmoe", "olmo2", "olmo3"}
_MTP_SHARES_EMBEDDINGS = {"glm_moe_dsa"}
_PATTERN_MLP = {"-": "dense", "E": "moe"}  # Nemotron-H pattern characters with an MLP
_GATED_Q = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}  # attn_output_gate: q_proj also yields the gate


class _Shape:
    """The per-layer pieces of one architecture."""

    def __init__(self, text: dict, hidden: int, num_heads: int, kv_heads: int, head_dim: int, beside: StateKind | None):
        self.text = text
        self.beside = beside
        self.model_type = str(text.get("model_type") or "")
        self.hidden = hidden
        self.num_heads = num_heads
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.num_experts = int(
            text.get("n_routed_experts") or text.get("num_local_experts") or text.get("num_experts") or 0
        )
        self.pattern = str(text.get("hybrid_override_pattern") or "")

    def decoder_layer(self, index: int, kind: CacheKind | None, mlp: str | None = None) -> int:
        mlp = mlp or self.mlp_kind(index)
        parallel = self.mixer(self.beside) if self.beside else 0
        return self.mixer(kind, index) + parallel + self.norms(kind, mlp) + self.mlp(mlp, index) + self.altup_laurel()

    def altup_laurel(self) -> int:
        """Gemma 3n's AltUp (altup_num_inputs streams: correction and prediction coefficients, a modality router and
        its norm, an output scale) and LAuReL (two low-rank maps of laurel_rank and a norm) in every layer
        (vllm/model_executor/models/gemma3n.py Gemma3nAltUp, Gemma3nLaurelBlock)."""
        if self.model_type != "gemma3n_text":
            return 0
        streams, rank = _field(self.text, "altup_num_inputs"), _field(self.text, "laurel_rank")
        altup = streams * streams + streams**3 + streams * self.hidden + 2 * self.hidden
        return altup + 2 * rank * self.hidden + self.hidden

    def kv_shared_attention(self, index: int) -> int:
        """Gemma 3n / Gemma 4: a layer that reads an earlier layer's KV keeps q_proj, o_proj and q_norm of its own
        (vllm/model_executor/models/gemma3n.py Gemma3nAttention l.316-325, gemma4.py Gemma4Attention l.409-447)."""
        full = (self.text.get("layer_types") or [])[index : index + 1] == ["full_attention"]
        head_dim = int(self.text.get("global_head_dim") or self.head_dim) if full else self.head_dim
        return 2 * self.hidden * self.num_heads * head_dim + head_dim

    def state_mixer(self, state: MambaState) -> int:
        if state.variant == "gdn":
            return _gated_delta_net(state, self.hidden)
        if state.variant == "kda":
            return _kimi_delta_attention(state, self.hidden)
        return _mamba2(self.text, state, self.hidden)

    def mixer(self, kind: CacheKind | None, index: int = 0) -> int:
        """The token mixer of a layer: attention (of this layer's heads), a recurrent layer, or none."""
        if isinstance(kind, Mamba1State):
            return _mamba1(self.text, kind, self.hidden)
        if isinstance(kind, ShortConvState):
            return _short_conv(self.text, kind, self.hidden)
        if isinstance(kind, MambaState):
            return self.state_mixer(kind)
        if kind is not None and kind.kind == "none" and self.text.get("num_kv_shared_layers"):
            return self.kv_shared_attention(index)
        if kind is not None and kind.kind == "none":
            attention = (self.text.get("block_configs") or [{}] * (index + 1))[index].get("attention") or {}
            return self.hidden * self.hidden if attention.get("replace_with_linear") else 0
        if self.text.get("kv_lora_rank"):
            return _mla_attention(self.text, self.hidden, self.num_heads) + self.indexer()
        kv_heads, head_dim = (kind.num_kv_heads, kind.head_dim) if kind is not None else (self.kv_heads, self.head_dim)
        heads = self.num_heads
        if isinstance(kind, SlidingWindow) and self.text.get("swa_num_attention_heads"):  # Step-3.5's sliding layers
            heads = _field(self.text, "swa_num_attention_heads")
        attention = _gqa_attention(self.text, self.hidden, heads, kv_heads, head_dim)
        if self.model_type in _GATED_Q and self.text.get("attn_output_gate", True):
            attention += self.hidden * heads * head_dim
        if self.text.get("use_head_wise_attn_gate"):  # step3p5.py g_proj: one gate a query head
            attention += self.hidden * heads
        return attention + self.qk_norms(head_dim, kv_heads)

    def indexer(self) -> int:
        """DeepSeek-V3.2's lightning indexer: query from the q latent, one key projection and its LayerNorm, and
        per-head weights."""
        dim = int(self.text.get("index_head_dim") or 0)
        if not dim:
            return 0
        heads, q_rank = _field(self.text, "index_n_heads"), int(self.text.get("q_lora_rank") or self.hidden)
        return q_rank * heads * dim + self.hidden * dim + 2 * dim + self.hidden * heads

    def qk_norms(self, head_dim: int, kv_heads: int) -> int:
        if (
            self.model_type in _QK_NORM_PER_HEAD
            or (self.model_type == "glm4_moe" and self.text.get("use_qk_norm"))
            or (self.model_type == "apertus" and self.text.get("qk_norm"))
            or (self.model_type in ("hunyuan_v1_moe", "hunyuan_v1_dense", "step3p5") and self.text.get("use_qk_norm"))
        ):
            return 2 * head_dim
        if self.model_type in ("bailing_moe", "bailing_moe_v2") and self.text.get("use_qk_norm"):
            # bailing_moe.py: an RMSNorm per head, or without use_rmsnorm a LayerNorm (weight and bias)
            return (2 if self.text.get("use_rmsnorm") else 4) * head_dim
        if self.model_type in _QK_NORM_PER_LAYER or (
            self.text.get("qk_norm_type") == "per_layer" and self.text.get("use_qk_norm")  # MiniMax-M2
        ):
            return (self.num_heads + kv_heads) * head_dim
        return 0

    def norms(self, kind: CacheKind | None, mlp: str) -> int:
        per_norm = 2 * self.hidden if self.model_type in _LAYER_NORM else self.hidden  # a LayerNorm has a bias
        if self.model_type in {"gemma2", "gemma3", "gemma3_text", "gemma3n_text", "gemma4_text", "glm4"}:
            return 4 * self.hidden  # pre and post norms around attention and MLP (glm4.py: post_self_attn_layernorm)
        if self.model_type in _ONE_NORM_PER_BLOCK or self._falcon_parallel():
            return per_norm
        return 2 * per_norm

    def _falcon_parallel(self) -> bool:
        """Falcon-7B's parallel attention shares one LayerNorm; the new decoder architecture (Falcon-40B, 180B)
        keeps two (ln_attn, ln_mlp), as vllm/model_executor/models/falcon.py builds them."""
        return (
            self.model_type == "falcon"
            and bool(self.text.get("parallel_attn", True))
            and not self.text.get("new_decoder_architecture")
        )

    def mlp_kind(self, index: int) -> str:
        """ "dense", "moe" or "none" for layer `index`, by the family's rule."""
        if self.pattern:  # Nemotron-H: - dense MLP, E MoE, M and * no MLP
            return _PATTERN_MLP.get(self.pattern[index] if index < len(self.pattern) else "", "none")
        if self.text.get("block_configs"):
            return "nas"
        if not self.num_experts or index in (self.text.get("mlp_only_layers") or ()):
            return "dense"
        if self.text.get("expert_layer_period"):  # Jamba: experts where index % period == offset
            offset = int(self.text.get("expert_layer_offset") or 0)
            return "moe" if index % int(self.text["expert_layer_period"]) == offset else "dense"
        frequency = self.text.get("moe_layer_freq")
        if isinstance(frequency, list):  # MiMo-V2: 1 marks a MoE layer
            return "moe" if index < len(frequency) and frequency[index] else "dense"
        if index < int(self.text.get("first_k_dense_replace") or 0):
            return "dense"
        step = int(self.text.get("interleave_moe_layer_step") or 1)
        return "moe" if (index + 1) % step == 0 else "dense"

    def mlp(self, kind: str, index: int = 0) -> int:
        if kind == "none":
            return 0
        if kind == "nas":
            return _nas_ffn(self.text["block_configs"][index].get("ffn") or {}, self.hidden)
        return self.moe_mlp() if kind == "moe" else self.dense_mlp()

    def _gated(self) -> bool:
        """Gate, up and down projections (SwiGLU); Nemotron-H's relu2 MLPs and experts and Apertus' xIELU MLP
        (vllm/model_executor/models/apertus.py: up_proj, down_proj) have up and down only."""
        return self.text.get("mlp_hidden_act") != "relu2" and self.text.get("hidden_act") != "xielu"

    def dense_mlp(self) -> int:
        if self.model_type in _PLAIN_MLP:  # fc1 and fc2, with their biases where the family has them
            ffn = int(_first_of(self.text, _FFN_SIZES) or 4 * self.hidden)
            biased = self.model_type not in _UNBIASED_MLP and self.text.get("bias", True)
            return 2 * self.hidden * ffn + (ffn + self.hidden if biased else 0)
        if self.model_type == "granitemoehybrid":  # no dense MLP: the shared MLP beside (or without) the experts
            return 3 * self.hidden * int(self.text.get("shared_intermediate_size") or 0)
        inter = int(
            _first_of(self.text, ("intermediate_size_mlp", "intermediate_size", "ffn_hidden_size")) or 4 * self.hidden
        )
        xielu = 2 if self.text.get("hidden_act") == "xielu" else 0  # the activation's alpha_p and alpha_n
        return (3 if self._gated() else 2) * self.hidden * inter + xielu

    def expert_intermediate(self) -> int:
        size = self.text.get("moe_intermediate_size") or self.text.get("intermediate_size")
        if size is None:
            raise ConfigError(
                "config.json: a mixture-of-experts model needs moe_intermediate_size or intermediate_size"
            )
        return int(size)

    def routed_experts(self) -> int:
        inter = self.expert_intermediate()
        width = int(self.text.get("moe_latent_size") or self.hidden)  # Nemotron-3 Super: experts in a latent width
        per_expert = (3 if self._gated() else 2) * width * inter
        if self.model_type == "gpt_oss":
            per_expert += 2 * inter + self.hidden
        return self.num_experts * per_expert

    def moe_mlp(self) -> int:
        """Routed experts, the router (with its bias or correction bias) and shared experts of one MoE layer."""
        router = self.hidden * self.num_experts
        biased = self.text.get("use_routing_bias") or self.text.get("moe_router_enable_expert_bias")  # bailing_moe.py
        if self.model_type == "gpt_oss" or biased or self._correction_bias():
            router += self.num_experts
        if self.model_type == "step3p5" and self.text.get("use_moe_router_bias", True):  # step3p5.py router_bias
            router += self.num_experts
        latent = int(self.text.get("moe_latent_size") or 0)
        projections = 2 * self.hidden * latent  # into and out of the experts' latent width
        return self.routed_experts() + router + self.shared_experts() + projections

    def shared_experts(self) -> int:
        text, hidden = self.text, self.hidden
        if text.get("share_expert_dim"):  # Step3: one shared SwiGLU expert of share_expert_dim beside the routed
            return 3 * hidden * _field(text, "share_expert_dim")
        if text.get("shared_expert_intermediate_size"):  # Qwen MoE: one shared expert and its sigmoid gate
            return 3 * hidden * _field(text, "shared_expert_intermediate_size") + hidden
        if text.get("moe_shared_expert_intermediate_size"):  # Nemotron-H
            return (3 if self._gated() else 2) * hidden * _field(text, "moe_shared_expert_intermediate_size")
        if self.model_type == "granitemoehybrid":
            return 3 * hidden * int(text.get("shared_intermediate_size") or 0)
        if self.model_type == "llama4_text":  # one shared expert of the experts' width
            return 3 * hidden * self.expert_intermediate()
        return int(text.get("n_shared_experts") or 0) * 3 * hidden * self.expert_intermediate()

    def _correction_bias(self) -> bool:
        """DeepSeek-V3's noaux_tc routing (also GLM-4.5, and ERNIE 4.5 MoE's gate in ernie45_moe.py) keeps an
        e_score_correction_bias per expert."""
        return self.text.get("topk_method") == "noaux_tc" or self.model_type in ("glm4_moe", "ernie4_5_moe")


# the MLP's width under each family's name (OPT, Phi and GPT-NeoX, GPT-2 and GPT-J, Falcon); absent or null: 4 x hidden
_FFN_SIZES = ("ffn_dim", "intermediate_size", "n_inner", "ffn_hidden_size")


def _first_of(text: dict, keys: tuple[str, ...]) -> Any:
    return next((text[key] for key in keys if text.get(key) is not None), None)


def _nas_ffn(ffn: dict, hidden: int) -> int:
    """A Nemotron NAS block's FFN: none, one linear map, or a gated MLP of ffn_mult x hidden (DeciLM's
    _ffn_mult_to_intermediate_size: 2/3 of it, rounded up to a multiple of 256)."""
    if ffn.get("no_op"):
        return 0
    if ffn.get("replace_with_linear"):
        return hidden * hidden
    inter = int(2 * float(_field(ffn, "ffn_mult", number=True)) * hidden / 3)
    inter = -(-inter // 256) * 256
    return 3 * hidden * inter


def _mamba2(text: dict, state: MambaState, hidden: int) -> int:
    """Mamba-2 mixer: in_proj to z, x, B, C and dt; the depthwise conv (with bias); dt bias, A and D per head;
    the gated norm; out_proj."""
    inner, heads = state.conv_channels, state.heads
    conv_dim = inner + 2 * state.groups * state.group_dim
    bias = bool(text.get("mamba_proj_bias", text.get("use_bias", False)))
    in_proj = hidden * (inner + conv_dim + heads) + (inner + conv_dim + heads if bias else 0)
    conv = conv_dim * state.conv_kernel + (
        conv_dim if text.get("use_conv_bias", text.get("mamba_conv_bias", True)) else 0
    )
    out_proj = inner * hidden + (hidden if bias else 0)
    norm = inner if text.get("mamba_rms_norm", True) else 0  # the gated norm (Falcon-H1's is off by default)
    return in_proj + conv + 3 * heads + norm + out_proj


def _short_conv(text: dict, state: ShortConvState, hidden: int) -> int:
    """LFM2's ShortConv (vllm/model_executor/models/lfm2.py): in_proj to B, C and x, the depthwise conv, out_proj;
    biases where conv_bias says so."""
    channels, bias = state.channels, bool(text.get("conv_bias", False))
    in_proj = hidden * 3 * channels + (3 * channels if bias else 0)
    conv = channels * state.conv_kernel + (channels if bias else 0)
    return in_proj + conv + channels * hidden + (hidden if bias else 0)


def _mamba1(text: dict, state: Mamba1State, hidden: int) -> int:
    """Jamba's Mamba-1 mixer (vLLM's MambaMixer): in_proj to x and z, the depthwise conv, x_proj to dt, B and C,
    dt_proj with its bias, A and D per channel and state, the dt, B and C norms, out_proj."""
    inner, state_size = state.intermediate, state.state_size
    dt_rank = _field(text, "mamba_dt_rank")
    bias = bool(text.get("mamba_proj_bias", False))
    in_proj = hidden * 2 * inner + (2 * inner if bias else 0)
    conv = inner * state.conv_kernel + (inner if text.get("mamba_conv_bias", True) else 0)
    x_proj = inner * (dt_rank + 2 * state_size)
    dt_proj = dt_rank * inner + inner
    out_proj = inner * hidden + (hidden if bias else 0)
    return in_proj + conv + x_proj + dt_proj + inner * state_size + inner + dt_rank + 2 * state_size + out_proj


def _gated_delta_net(state: MambaState, hidden: int) -> int:
    """Gated DeltaNet mixer (Qwen3-Next, Qwen3.5): q, k, v and z projections, b and a per value head, the
    depthwise conv over q, k and v, dt bias and A per value head, the per-head norm, out_proj."""
    key_dim = state.groups * state.group_dim
    value_dim = state.heads * state.head_dim
    conv_dim = 2 * key_dim + value_dim
    return (
        hidden * (2 * key_dim + 2 * value_dim)
        + hidden * 2 * state.heads
        + conv_dim * state.conv_kernel
        + 2 * state.heads
        + state.head_dim
        + value_dim * hidden
    )


def _kimi_delta_attention(state: MambaState, hidden: int) -> int:
    """Kimi Delta Attention (vllm/models/kimi_k3/nvidia/kda.py KimiK3DeltaAttention): q, k, v, b (a head) and f_a (a
    head dim) from the hidden state, f_b back up to the heads, the depthwise conv over q, k and v, dt bias and A,
    the output gate's g_a and g_b, the per-head norm, o_proj."""
    projection = state.heads * state.head_dim
    return (
        hidden * (3 * projection + state.heads + state.head_dim)
        + state.head_dim * projection
        + 3 * projection * state.conv_kernel
        + projection
        + state.heads
        + hidden * state.head_dim
        + state.head_dim * projection
        + state.head_dim
        + projection * hidden
    )


def _mtp_module(shape: _Shape, vocab: int) -> int:
    """One DeepSeek-style MTP module as checkpoints store it: a MoE decoder layer, the embedding and hidden norms,
    the projection of both into one hidden state, the shared head's norm, and copies of the embeddings and head
    (GLM-5 stores no copies: its MTP layer shares them)."""
    hidden = shape.hidden
    copies = 0 if shape.model_type in _MTP_SHARES_EMBEDDINGS else 2 * vocab * hidden
    return shape.decoder_layer(0, None, mlp="moe") + 2 * hidden + 2 * hidden * hidden + hidden + copies


def _gqa_attention(text: dict, hidden: int, num_heads: int, kv_heads: int, head_dim: int) -> int:
    q = hidden * num_heads * head_dim
    if share_q := int(text.get("share_q_dim") or 0):  # Step3: q through a share_q_dim bottleneck and its norm
        q = hidden * share_q + share_q + share_q * num_heads * head_dim
    kv = 2 * hidden * kv_heads * head_dim
    out = num_heads * head_dim * hidden
    bias = 0
    # ChatGLM's add_qkv_bias, StableLM's use_qkv_bias
    if (
        text.get("attention_bias")
        or text.get("add_qkv_bias")
        or text.get("use_qkv_bias")
        or text.get("model_type") in _QKV_BIAS
    ):
        bias = num_heads * head_dim + 2 * kv_heads * head_dim
        if text.get("model_type") in _OUT_BIAS:
            bias += hidden  # output projection bias
    sinks = num_heads if text.get("model_type") == "gpt_oss" else 0
    return q + kv + out + bias + sinks


def _mla_attention(text: dict, hidden: int, num_heads: int) -> int:
    rope = _field(text, "qk_rope_head_dim")
    nope = int(text.get("qk_nope_head_dim") or 0)
    v_dim = int(text.get("v_head_dim") or nope)
    kv_rank = _field(text, "kv_lora_rank")
    q_rank = text.get("q_lora_rank")
    q_head = num_heads * (nope + rope)
    q = hidden * int(q_rank) + int(q_rank) + int(q_rank) * q_head if q_rank else hidden * q_head
    kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * num_heads * (nope + v_dim)
    out = num_heads * v_dim * hidden
    return q + kv + out


def _field(fields: dict, key: str, *, number: bool = False) -> Any:
    """A field the count cannot do without: KeyError (which names it, one line up the stack) when it is absent or
    null. Its type and range were checked with the rest of config.json (fields.check_config)."""
    value = fields.get(key)
    if value is None:
        raise KeyError(key)
    return value if number else int(value)


# --- vision towers ----------------------------------------------------------------------------------------


def vision_parameters(wrapper: dict[str, Any]) -> int:
    """The multimodal towers and their projectors (vision, and Gemma 4's audio), for the towers counted here (0 for
    others or none): what a text-only engine (--language-model-only) does not load."""
    text_hidden = int((wrapper.get("text_config") or {}).get("hidden_size") or 0)
    total = 0
    vision = wrapper.get("vision_config")
    if isinstance(vision, dict):
        counter = _VISION_TOWERS.get(str(vision.get("model_type") or ""))
        total += counter(wrapper, vision, text_hidden) if counter else 0
    audio = wrapper.get("audio_config")
    if isinstance(audio, dict) and str(audio.get("model_type") or "") in _CONFORMER_AUDIO:
        total += _conformer_audio(audio, text_hidden)
    return total


# Gemma 4's towers as their configs describe them, where a checkpoint's config leaves the defaults unwritten: the
# E-series vision encoder is a 16-layer ViT of width 768 (12 heads), the audio encoder a 12-layer Conformer of width
# 1024 projected to output_proj_dims 1536 (public gemma-4 config excerpts, code-index ids 51768787626, 65721018737;
# transformers' Gemma4AudioConfig defaults, the tower vLLM's gemma4_mm.py builds with AutoModel.from_config). An estimate of the layers' matrices (norms and biases left out): the checkpoint's own safetensors
# headers replace it when read.
_GEMMA4_VISION = {"hidden_size": 768, "num_hidden_layers": 16, "intermediate_size": 3072}
_CONFORMER_AUDIO = {"gemma4_audio": {"hidden_size": 1024, "num_hidden_layers": 12}, "gemma3n_audio": {}}


def _gemma4_vision(wrapper: dict, vision: dict, text_hidden: int) -> int:
    """A ViT: per layer q, k, v, o (4 w^2) and a gated MLP (3 w x i), then the projector to the text width."""
    merged = {**_GEMMA4_VISION, **{key: value for key, value in vision.items() if value is not None}}
    width, inter = (
        _field(merged, "hidden_size"),
        int(merged.get("intermediate_size") or 4 * _field(merged, "hidden_size")),
    )
    layer = 4 * width * width + 3 * width * inter
    return _field(merged, "num_hidden_layers") * layer + width * text_hidden


def _conformer_audio(audio: dict, text_hidden: int) -> int:
    """A Conformer: per layer two feed-forward modules (w -> 4w -> w, 8 w^2 each), attention with a relative
    position projection (5 w^2) and a light convolution module (GLU in, out: 3 w^2), then the projector."""
    defaults = _CONFORMER_AUDIO.get(str(audio.get("model_type") or ""), {})
    merged = {**defaults, **{key: value for key, value in audio.items() if value is not None}}
    width = int(merged.get("hidden_size") or 0)
    layers = int(merged.get("num_hidden_layers") or merged.get("conf_num_hidden_layers") or 0)
    out = int(merged.get("output_proj_dims") or width)
    return layers * 24 * width * width + width * out + out * text_hidden


def _siglip(wrapper: dict, vision: dict, text_hidden: int) -> int:
    """SigLIP encoder (Gemma 3, LLaVA-NeXT's Granite Vision): patch convolution, learned positions, pre-norm layers
    with biased projections, a post-norm, and the attention-pooling head unless vision_use_head is false (Gemma 3
    sets it false; transformers and vLLM build it when the field is absent). Gemma 3's projector is one matrix to
    the text width and a soft-embedding norm; LLaVA-NeXT's two layers from the concatenated vision_feature_layer
    outputs to the text width, and its image_newline vector."""
    width, inter = _field(vision, "hidden_size"), _field(vision, "intermediate_size")
    patch, channels = _field(vision, "patch_size"), int(vision.get("num_channels") or 3)
    positions = (_field(vision, "image_size") // patch) ** 2
    embeddings = channels * patch * patch * width + width + positions * width
    layer = 2 * 2 * width + 4 * (width * width + width) + (width * inter + inter) + (inter * width + width)
    tower = embeddings + _field(vision, "num_hidden_layers") * layer + 2 * width
    if vision.get("vision_use_head", True):  # a probe, attention (fused in-projection), a LayerNorm and an MLP
        tower += width + (3 * width * width + 3 * width) + (width * width + width) + 2 * width
        tower += (width * inter + inter) + (inter * width + width)
    if wrapper.get("model_type") == "llava_next":
        features = wrapper.get("vision_feature_layer")
        merged = width * (len(features) if isinstance(features, list) else 1)
        bias = 2 * text_hidden if wrapper.get("multimodal_projector_bias", True) else 0
        return tower + merged * text_hidden + text_hidden * text_hidden + bias + text_hidden
    return tower + width * text_hidden + width


def _pixtral(wrapper: dict, vision: dict, text_hidden: int) -> int:
    """Pixtral encoder (Mistral 3): bias-free patch convolution, a pre-norm, RMS-normed layers of bias-free
    attention and gated MLP; Mistral 3's projector: a norm, the patch merger and a two-layer MLP."""
    width, inter = _field(vision, "hidden_size"), _field(vision, "intermediate_size")
    patch, channels = _field(vision, "patch_size"), int(vision.get("num_channels") or 3)
    layer = 2 * width + 4 * width * width + 3 * width * inter
    tower = channels * patch * patch * width + width + _field(vision, "num_hidden_layers") * layer
    merge = int(wrapper.get("spatial_merge_size") or 2)
    bias = bool(wrapper.get("multimodal_projector_bias"))
    projector = width + merge * merge * width * width + width * text_hidden + text_hidden * text_hidden
    if bias:
        projector += 2 * text_hidden
    return tower + projector


def _qwen3_vl(wrapper: dict, vision: dict, text_hidden: int) -> int:
    """Qwen3-VL's vision encoder (Qwen3.5): a 3-D patch convolution with bias, learned positions, LayerNorm
    blocks with biased projections, and the patch merger (a norm and a two-layer MLP to the text width)."""
    width, inter = _field(vision, "hidden_size"), _field(vision, "intermediate_size")
    patch = _field(vision, "in_channels") * _field(vision, "temporal_patch_size") * _field(vision, "patch_size") ** 2
    embeddings = patch * width + width + _field(vision, "num_position_embeddings") * width
    block = 4 * width + (width * 3 * width + 3 * width) + (width * width + width) + (width * inter + inter)
    block += inter * width + width
    merged = width * _field(vision, "spatial_merge_size") ** 2
    out = int(vision.get("out_hidden_size") or text_hidden)
    merger = 2 * width + (merged * merged + merged) + (merged * out + out)
    deepstack = len(vision.get("deepstack_visual_indexes") or ()) * (
        2 * merged + merged * merged + merged + merged * out + out
    )
    return embeddings + _field(vision, "depth") * block + merger + deepstack


def merge_kernel(vision: dict) -> int:
    """Patches one MoonViT token merges: the product of merge_kernel_size (Kimi-VL's [2, 2], its config class's
    default)."""
    kernel = vision.get("merge_kernel_size") or (2, 2)
    merged = 1
    for side in kernel:
        merged *= max(1, int(side))
    return merged


def _moonvit(wrapper: dict, vision: dict, text_hidden: int) -> int:
    """MoonViT (Kimi-VL): a biased patch convolution, learned init_pos_emb_height x init_pos_emb_width positions,
    pre-norm blocks of a biased fused qkv, output and two-layer MLP with two LayerNorms, a final LayerNorm; Kimi-VL's
    projector: a LayerNorm, then two biased layers from the merged patches (merge_kernel_size) to the text width."""
    width, inter = _field(vision, "hidden_size"), _field(vision, "intermediate_size")
    patch, channels = _field(vision, "patch_size"), int(vision.get("num_channels") or 3)
    positions = _field(vision, "init_pos_emb_height") * _field(vision, "init_pos_emb_width")
    embeddings = channels * patch * patch * width + width + positions * width
    block = 2 * 2 * width + (width * 3 * width + 3 * width) + (width * width + width) + (width * inter + inter)
    block += inter * width + width
    tower = embeddings + _field(vision, "num_hidden_layers") * block + 2 * width
    merged = width * merge_kernel(vision)
    projector = 2 * width + (merged * merged + merged) + (merged * text_hidden + text_hidden)
    return tower + projector


_VISION_TOWERS = {
    "siglip_vision_model": _siglip,
    "moonvit": _moonvit,
    "gemma4_vision": _gemma4_vision,
    "pixtral": _pixtral,
    **dict.fromkeys(("qwen3_5", "qwen3_5_moe", "qwen3_5_vision", "qwen3_5_moe_vision"), _qwen3_vl),
}
