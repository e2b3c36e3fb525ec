"""What a model's KV cache is made of: a few small layer kinds, each knowing its own cost per token per GPU.

The KV formula, per layer:  bytes per token = Hkv_per_gpu x (Dk + Dv) x s  (K and V, KV heads on this GPU,
head dims, bytes per value; Dk = Dv = D for most models, so 2 x Hkv x D x s). A sliding-window layer caches at
most W tokens, a chunked local-attention layer (Llama 4) at most its chunk; an MLA layer caches one latent of
kv_lora_rank + qk_rope_head_dim values per token, the same on every tensor-parallel rank; a sparse-attention
indexer (DeepSeek-V3.2) caches one fp8 key with fp32 scales per token beside it. A state layer (Mamba-1, Mamba-2,
Gated DeltaNet) caches no tokens: one fixed-size recurrent state (a convolution window and the SSM state) per sequence.
"""

from __future__ import annotations

import itertools
from dataclasses import field, replace
from math import ceil, prod
from typing import TYPE_CHECKING, Any, ClassVar

from kvops.dtypes import SCALE_BYTES, KvDtype
from kvops.errors import UsageError
from kvops.frozen import frozen

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kvops.model.checkpoint import Checkpoint

ATTENTION_KINDS = ("full", "sliding", "chunked", "mla")


def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """KV heads one tensor-parallel rank holds: split when tp <= Hkv, replicated (one per rank) beyond."""
    return max(1, num_kv_heads // tp)


@frozen
class FullAttention:
    """A layer that caches K and V of every token."""

    kind: ClassVar[str] = "full"
    num_kv_heads: int
    head_dim: int
    v_head_dim: int = 0  # when V is narrower than K (MiMo-V2's sliding layers); 0: the same as head_dim
    rope_dim: int = 0  # rotary dims of a key (partial rotary); 0: all of head_dim (read by Octave's packed slot)

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    def heads_per_gpu(self, tp: int) -> int:
        return kv_heads_per_gpu(self.num_kv_heads, tp)

    def values_per_token(self, tp: int) -> int:
        return self.heads_per_gpu(tp) * (self.head_dim + self.value_dim)

    def scales_per_token(self, tp: int) -> int:
        return 2 * self.heads_per_gpu(tp)

    def data_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        if dtype.is_packed:  # codes and scales in one slot per KV head
            return self.heads_per_gpu(tp) * dtype.slot_bytes(self.head_dim, self.value_dim, self.rope_dim)
        return ceil(self.values_per_token(tp) * dtype.bits / 8)

    def scale_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return self.scales_per_token(tp) * SCALE_BYTES if dtype.scales == "per_token_head" else 0

    def bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return self.data_bytes_per_token(dtype, tp) + self.scale_bytes_per_token(dtype, tp)

    def cached_tokens(self, tokens: int) -> int:
        return tokens

    def formula(self, dtype: KvDtype, tp: int) -> str:
        if dtype.is_packed:
            slot = dtype.slot_bytes(self.head_dim, self.value_dim, self.rope_dim)
            return f"{self.heads_per_gpu(tp)} kv_heads x {slot} B packed K+V slot ({dtype.name})"
        if self.v_head_dim and self.v_head_dim != self.head_dim:
            return f"{self.heads_per_gpu(tp)} kv_heads x ({self.head_dim} + {self.v_head_dim}) K+V dims x {dtype.bytes:g} B"
        return f"2 x {self.heads_per_gpu(tp)} kv_heads x {self.head_dim} head_dim x {dtype.bytes:g} B"

    def label(self) -> str:
        return self.kind


@frozen
class SlidingWindow(FullAttention):
    """A layer that attends to (and needs to cache) only the last `window` tokens."""

    kind: ClassVar[str] = "sliding"
    window: int = 0

    def cached_tokens(self, tokens: int) -> int:
        return min(tokens, self.window)

    def label(self) -> str:
        return f"sliding {self.window}"


def _full(layer: SlidingWindow) -> FullAttention:
    return FullAttention(layer.num_kv_heads, layer.head_dim, layer.v_head_dim, layer.rope_dim)


@frozen
class ChunkedLocal(FullAttention):
    """Llama 4's chunked local attention: a token attends only within its chunk of `chunk` tokens, so the layer
    holds at most the current chunk (vLLM's ChunkedLocalAttentionSpec)."""

    kind: ClassVar[str] = "chunked"
    chunk: int = 0

    def cached_tokens(self, tokens: int) -> int:
        return min(tokens, self.chunk)

    def label(self) -> str:
        return f"chunked {self.chunk}"


@frozen
class MultiLatentAttention:
    """DeepSeek's MLA: one compressed latent plus the rotary key part per token, shared by all heads.

    vLLM caches it as one 'head' of kv_lora_rank + qk_rope_head_dim values, replicated on every TP rank.
    """

    kind: ClassVar[str] = "mla"
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int = 0  # per-head query/key width besides the rotary part (not cached by vLLM's MLA)
    v_head_dim: int = 0  # per-head value width (engines without MLA, e.g. TGI, cache full K/V heads of these)
    sparse: bool = False  # DeepSeek-V3.2 sparse attention: attends to the indexer's top-k tokens

    @property
    def num_kv_heads(self) -> int:
        return 1

    @property
    def head_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def heads_per_gpu(self, tp: int) -> int:
        return 1

    def values_per_token(self, tp: int) -> int:
        return self.head_dim

    def scales_per_token(self, tp: int) -> int:
        return 1

    def data_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        if dtype.is_packed:
            raise UsageError(f"--kv-dtype {dtype.name} packs K and V heads; an MLA latent cache has no such layout")
        return ceil(self.values_per_token(tp) * dtype.bits / 8)

    def scale_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return SCALE_BYTES if dtype.scales == "per_token_head" else 0

    def bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return self.data_bytes_per_token(dtype, tp) + self.scale_bytes_per_token(dtype, tp)

    def cached_tokens(self, tokens: int) -> int:
        return tokens

    def formula(self, dtype: KvDtype, tp: int) -> str:
        return f"({self.kv_lora_rank} kv_lora_rank + {self.qk_rope_head_dim} qk_rope_head_dim) x {dtype.bytes:g} B (not split by tp)"

    def label(self) -> str:
        return "mla"


INDEXER_QUANT_BLOCK = 128  # vLLM's indexer stores fp8 keys with one fp32 scale per 128 values


@frozen
class SparseIndexer:
    """DeepSeek-V3.2's lightning indexer (also GLM-5): per token one fp8 key of index_head_dim values and one fp32
    scale per 128 of them, whatever the KV dtype; one per MLA layer, not split by tp (vLLM's
    DeepseekV32IndexerCache)."""

    kind: ClassVar[str] = "indexer"
    index_head_dim: int

    @property
    def num_kv_heads(self) -> int:
        return 1

    @property
    def head_dim(self) -> int:
        """Bytes per token (vLLM caches it as uint8)."""
        return self.index_head_dim + self.index_head_dim // INDEXER_QUANT_BLOCK * SCALE_BYTES

    def heads_per_gpu(self, tp: int) -> int:
        return 1

    def scale_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return 0

    def bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return self.head_dim

    def cached_tokens(self, tokens: int) -> int:
        return tokens

    def formula(self, dtype: KvDtype, tp: int) -> str:
        return f"({self.index_head_dim} fp8 + {self.index_head_dim // INDEXER_QUANT_BLOCK} x 4 B scales) index key B (any KV dtype, not split by tp)"

    def label(self) -> str:
        return "indexer"


class RecurrentState:
    """What every recurrent layer's state shares: no per-token cost, one fixed-size state per sequence (a
    convolution window and an SSM state, both split by tp), as vLLM's MambaSpec pages it. Each kind gives its shapes
    (MambaStateShapeCalculator) and the tensor-parallel sizes they split by."""

    kind: ClassVar[str] = "mamba"
    variant: str
    ssm_dtype: str  # the dtype the config declares for the SSM state ("" when it declares none)
    num_kv_heads: ClassVar[int] = 0

    def conv_shape(self, tp: int, speculative_tokens: int = 0) -> tuple[int, ...]:
        raise NotImplementedError

    def ssm_shape(self, tp: int) -> tuple[int, ...]:
        raise NotImplementedError

    def splits(self, tp: int) -> bool:
        raise NotImplementedError

    def heads_per_gpu(self, tp: int) -> int:
        return 0

    def state_bytes(self, conv_bytes: float, ssm_bytes: float, tp: int, speculative_tokens: int = 0) -> int:
        """One sequence's state on one GPU: conv window and SSM state at their dtypes' sizes."""
        return ceil(prod(self.conv_shape(tp, speculative_tokens)) * conv_bytes) + ceil(
            prod(self.ssm_shape(tp)) * ssm_bytes
        )

    def bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return 0

    def scale_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return 0

    def cached_tokens(self, tokens: int) -> int:
        return 0

    def formula(self, dtype: KvDtype, tp: int) -> str:
        conv = "x".join(map(str, self.conv_shape(tp)))
        ssm = "x".join(map(str, self.ssm_shape(tp)))
        return f"state per sequence: conv {conv} + ssm {ssm} values (no per-token cost)"

    def label(self) -> str:
        return f"{self.variant} state"


@frozen
class MambaState(RecurrentState):
    """Mamba-2 or Gated DeltaNet: a convolution window of (conv_kernel - 1) x conv_dim values and an SSM state of
    heads x head_dim x state.

    variant "mamba2" (Mamba-2: SSM heads x head_dim x state, conv over intermediate + 2 x groups x state;
    groups that do not split evenly are replicated) or "gdn" (Gated DeltaNet: value heads x value dim x key dim,
    conv over 2 x key heads x key dim + value heads x value dim) or "kda" (Kimi Delta Attention: Gated DeltaNet's
    shapes with as many key as value heads, of one head dim).
    """

    variant: str
    conv_kernel: int
    conv_channels: int  # intermediate (mamba2) or value heads x value dim (gdn), before tp
    groups: int  # mamba2 groups, or gdn key heads
    group_dim: int  # mamba2 state size, or gdn key head dim
    heads: int  # SSM heads (mamba2) or value heads (gdn)
    head_dim: int  # SSM head dim (mamba2) or value head dim (gdn)
    ssm_dtype: str = ""

    def conv_shape(self, tp: int, speculative_tokens: int = 0) -> tuple[int, int]:
        groups = self.groups
        if self.variant == "mamba2" and groups % tp:  # replicated so each head shard has its groups
            groups = tp
        conv_dim = self.conv_channels + 2 * groups * self.group_dim
        return (self.conv_kernel - 1 + speculative_tokens, conv_dim // tp)

    def ssm_shape(self, tp: int) -> tuple[int, int, int]:
        return (self.heads // tp, self.head_dim, self.group_dim)

    def splits(self, tp: int) -> bool:
        return not self.heads % tp and not (self.variant in ("gdn", "kda") and self.groups % tp)


@frozen
class Mamba1State(RecurrentState):
    """Mamba-1 (Jamba's MambaMixer): a convolution window of (conv_kernel - 1) x intermediate values and an SSM
    state of intermediate x state_size, both split by tp (`mamba1_state_shape`); the window keeps no row per
    speculative token."""

    variant: ClassVar[str] = "mamba1"  # type: ignore[misc]  # one Mamba-1 kind: no field to set
    head_dim: ClassVar[int] = 0
    conv_kernel: int
    intermediate: int  # mamba_expand x hidden_size, before tp
    state_size: int
    ssm_dtype: str = ""

    def conv_shape(self, tp: int, speculative_tokens: int = 0) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.intermediate // tp)

    def ssm_shape(self, tp: int) -> tuple[int, int]:
        return (self.intermediate // tp, self.state_size)

    def splits(self, tp: int) -> bool:
        return not self.intermediate % tp


@frozen
class ShortConvState(RecurrentState):
    """LFM2's short convolution: a window of (conv_kernel - 1) x channels values split by tp and no SSM state
    (`short_conv_state_shape`, vllm/model_executor/layers/mamba/mamba_utils.py); the window keeps a row per
    speculative token."""

    variant: ClassVar[str] = "short_conv"  # type: ignore[misc]  # one kind: no field to set
    head_dim: ClassVar[int] = 0
    conv_kernel: int  # conv_L_cache
    channels: int  # conv_dim, before tp
    ssm_dtype: str = ""

    def conv_shape(self, tp: int, speculative_tokens: int = 0) -> tuple[int, int]:
        return (self.conv_kernel - 1 + speculative_tokens, self.channels // tp)

    def ssm_shape(self, tp: int) -> tuple[int]:
        return (0,)

    def splits(self, tp: int) -> bool:
        return not self.channels % tp

    def formula(self, dtype: KvDtype, tp: int) -> str:
        conv = "x".join(map(str, self.conv_shape(tp)))
        return f"state per sequence: conv {conv} values, no SSM state (no per-token cost)"


@frozen
class NoCache:
    """A layer that keeps nothing per sequence: an MLP or MoE-only block (Nemotron-H), an attention that is a
    no-op or a linear map (Nemotron NAS), or one that reads another layer's KV (shared KV layers)."""

    kind: ClassVar[str] = "none"
    num_kv_heads: ClassVar[int] = 0
    head_dim: ClassVar[int] = 0


StateKind = MambaState | Mamba1State | ShortConvState
LayerKind = FullAttention | SlidingWindow | ChunkedLocal | MultiLatentAttention | SparseIndexer | StateKind
CacheKind = LayerKind | NoCache


@frozen
class LayerGroup:
    """Layers of one identical kind, with their indices in the model."""

    layer: LayerKind
    indices: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.indices)


@frozen
class ParameterCount:
    total: int  # the language model an engine loads for text generation (MTP and vision towers apart)
    experts: int  # inside routed experts
    num_experts: int
    mtp: int = 0  # multi-token-prediction layers the checkpoint stores (vLLM loads them only to speculate)
    vision: int = 0  # vision tower and projector, when its architecture is counted
    embeddings: int = 0  # the token embedding matrix (vocab x hidden)
    lm_head: int = 0  # an untied LM head (0 when tied to the embeddings)
    layers: tuple[int, ...] = ()  # each decoder layer (what pipeline stages split)
    layer_experts: tuple[int, ...] = ()  # each decoder layer's routed experts

    @property
    def checkpoint(self) -> int:
        """Every parameter the checkpoint stores, as far as it is counted."""
        return self.total + self.mtp + self.vision


@frozen
class EncoderShape:
    """A multimodal encoder as the profile run exercises it: its width, MLP size, encoder positions (patches) per
    language-model token it yields (a spatial merge of 2 x 2 feeds 4 patches into one token), and the most
    language-model tokens one image yields where that is known (0: not above the batched tokens)."""

    width: int
    intermediate: int
    patches_per_token: int = 1
    max_item_tokens: int = 0


@frozen
class ModelSpec:
    """A model reduced to the facts that decide its serving memory. Built once from a config.json."""

    name: str
    source: str  # "catalog", "path", "hf-cache" or "hub"
    model_type: str
    dtype: str  # canonical weight/activation dtype of the checkpoint, e.g. "bf16"
    layers: tuple[CacheKind, ...]  # the main cache of each decoder layer, in order
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int | None
    parameters: int  # what the engine loads for text generation
    parameters_source: str  # "catalog" (a published count), "config" (counted) or "checkpoint" (its own bytes)
    checkpoint_parameters: int = 0  # what the checkpoint stores (published, or counted)
    count: ParameterCount | None = None  # the count from the architecture, part by part
    expert_parameters: int = 0  # weights inside routed MoE experts (their own quantization may apply)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    quantization: dict | None = None  # the config's quantization_config, as given
    architectures: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    source_path: str | None = None
    window_cap: int | None = None  # --disable-sliding-window: the context capped at the sliding window
    extra_caches: tuple[tuple[int, LayerKind], ...] = ()  # a second cache in some layers (the indexer), by index
    mtp_layers: int = 0  # MTP modules the checkpoint carries (num_nextn_predict_layers)
    revision: str | None = None  # the Hub revision read, when the model came from the Hub
    checkpoint: Checkpoint | None = field(default=None, compare=False, repr=False)  # its safetensors headers, if read
    # the config.json as read, top level and unmerged: for an engine whose own rule reads raw fields (TGI's launcher)
    config_json: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    encoder: EncoderShape | None = None  # a vision encoder the engine profiles (None: text only, or not read)
    notes: tuple[str, ...] = field(default=())  # how ambiguous config fields were read
    warnings: tuple[str, ...] = field(default=())  # what a user must hear: a layer count taken from a default

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def mtp_parameters(self) -> int:
        """Multi-token-prediction layers in the checkpoint (vLLM loads them only for MTP speculative decoding)."""
        return self.count.mtp if self.count else 0

    @property
    def vision_parameters(self) -> int:
        """The vision tower and projector (counted), loaded with the model."""
        return self.count.vision if self.count else 0

    def caches(self) -> list[tuple[int, LayerKind]]:
        """Every cache the model keeps, with its layer index: the main ones, then the extra ones."""
        main = [(index, layer) for index, layer in enumerate(self.layers) if not isinstance(layer, NoCache)]
        return main + list(self.extra_caches)

    def attention_layers(self) -> list[LayerKind]:
        return [layer for _, layer in self.caches() if layer.kind in ATTENTION_KINDS]

    @property
    def num_kv_heads(self) -> int:
        return max((layer.num_kv_heads for layer in self.attention_layers()), default=0)

    @property
    def head_dim(self) -> int:
        return max((layer.head_dim for layer in self.attention_layers()), default=0)

    @property
    def is_mla(self) -> bool:
        return any(layer.kind == "mla" for layer in self.layers)

    @property
    def is_sparse_mla(self) -> bool:
        """DeepSeek-V3.2-style sparse MLA, whose backends and 8-bit storage differ from dense MLA's."""
        return any(isinstance(layer, MultiLatentAttention) and layer.sparse for layer in self.layers)

    @property
    def has_state(self) -> bool:
        """Recurrent state layers (Mamba, Gated DeltaNet) beside attention: a hybrid model."""
        return any(layer.kind == "mamba" for _, layer in self.caches())

    @property
    def sliding_window(self) -> int | None:
        windows = [layer.window for layer in self.layers if isinstance(layer, SlidingWindow)]
        return max(windows) if windows else None

    def without_sliding_window(self, configured: int | None = None) -> ModelSpec:
        """The model as vLLM's --disable-sliding-window serves it: every sliding-window layer attends to (and caches)
        the whole context, and the context is capped at the window where it is shorter than the model's own
        (ModelConfig: `hf_text_config.sliding_window = None` after `get_and_verify_max_len` takes the window as
        the longest context, vllm/config/model.py). `configured`: the config's sliding_window, where the layers'
        differs from it (Command R7B's layers see sliding_window + 1 tokens; vLLM caps at the config's)."""
        if self.sliding_window is None:
            return self
        window = configured or self.sliding_window
        full = tuple(_full(layer) if isinstance(layer, SlidingWindow) else layer for layer in self.layers)
        extra = tuple(
            (index, _full(layer) if isinstance(layer, SlidingWindow) else layer) for index, layer in self.extra_caches
        )
        limit = window if self.max_position_embeddings is None else min(self.max_position_embeddings, window)
        return replace(self, layers=full, extra_caches=extra, max_position_embeddings=limit, window_cap=window)

    @property
    def attention_chunk(self) -> int | None:
        chunks = [layer.chunk for layer in self.layers if isinstance(layer, ChunkedLocal)]
        return max(chunks) if chunks else None

    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """Identical caches gathered, in order of first appearance."""
        indices: dict[LayerKind, list[int]] = {}
        for index, layer in self.caches():
            indices.setdefault(layer, []).append(index)
        return tuple(LayerGroup(layer, tuple(found)) for layer, found in indices.items())

    def layer_pattern(self) -> str:
        """Human summary of the layer kinds, e.g. 'sliding 4096 on 21 of 42 layers (every 2nd from 0)'."""
        groups = self.layer_groups()
        if len(groups) == 1 and groups[0].count == self.num_layers:
            return f"{groups[0].layer.label()} on all {self.num_layers} layers"
        parts = []
        for group in groups:
            parts.append(f"{group.layer.label()} on {group.count} of {self.num_layers}{_stride_note(group.indices)}")
        return "; ".join(parts)


def _stride_note(indices: tuple[int, ...]) -> str:
    if len(indices) < 2:
        return f" (layer {indices[0]})"
    stride = indices[1] - indices[0]
    if all(b - a == stride for a, b in itertools.pairwise(indices)):
        return f" (every {stride} from {indices[0]})" if stride > 1 else f" (layers {indices[0]}-{indices[-1]})"
    return ""
