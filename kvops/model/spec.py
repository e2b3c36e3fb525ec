"""What a model's KV cache is made of: a few small layer kinds, each knowing its own cost per token per GPU.

The KV formula, per layer:  bytes per token = 2 x Hkv_per_gpu x D x s  (K and V, KV heads on this GPU,
head dim, bytes per value). A sliding-window layer caches at most W tokens; an MLA layer caches one latent of
kv_lora_rank + qk_rope_head_dim values per token, the same on every tensor-parallel rank.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from math import ceil
from typing import ClassVar

from kvops.dtypes import SCALE_BYTES, KvDtype


def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """KV heads one tensor-parallel rank holds: split when tp <= Hkv, replicated (one per rank) beyond."""
    return max(1, num_kv_heads // tp)


@dataclass(frozen=True)
class FullAttention:
    """A layer that caches K and V of every token."""

    kind: ClassVar[str] = "full"
    num_kv_heads: int
    head_dim: int

    def heads_per_gpu(self, tp: int) -> int:
        return kv_heads_per_gpu(self.num_kv_heads, tp)

    def values_per_token(self, tp: int) -> int:
        return 2 * self.heads_per_gpu(tp) * self.head_dim

    def scales_per_token(self, tp: int) -> int:
        return 2 * self.heads_per_gpu(tp)

    def data_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return ceil(self.values_per_token(tp) * dtype.bits / 8)

    def scale_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return self.scales_per_token(tp) * SCALE_BYTES if dtype.scales == "per_token_head" else 0

    def bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return self.data_bytes_per_token(dtype, tp) + self.scale_bytes_per_token(dtype, tp)

    def cached_tokens(self, tokens: int) -> int:
        return tokens

    def formula(self, dtype: KvDtype, tp: int) -> str:
        return f"2 x {self.heads_per_gpu(tp)} kv_heads x {self.head_dim} head_dim x {dtype.bytes:g} B"


@dataclass(frozen=True)
class SlidingWindow(FullAttention):
    """A layer that attends to (and needs to cache) only the last `window` tokens."""

    kind: ClassVar[str] = "sliding"
    window: int = 0

    def cached_tokens(self, tokens: int) -> int:
        return min(tokens, self.window)


@dataclass(frozen=True)
class MultiLatentAttention:
    """DeepSeek's MLA: one compressed latent plus the rotary key part per token, shared by all heads.

    vLLM caches it as one 'head' of kv_lora_rank + qk_rope_head_dim values, replicated on every TP rank.
    """

    kind: ClassVar[str] = "mla"
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int = 0  # per-head query/key width besides the rotary part (not cached by vLLM's MLA)
    v_head_dim: int = 0  # per-head value width (engines without MLA, e.g. TGI, cache full K/V heads of these)

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
        return ceil(self.values_per_token(tp) * dtype.bits / 8)

    def scale_bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return SCALE_BYTES if dtype.scales == "per_token_head" else 0

    def bytes_per_token(self, dtype: KvDtype, tp: int) -> int:
        return self.data_bytes_per_token(dtype, tp) + self.scale_bytes_per_token(dtype, tp)

    def cached_tokens(self, tokens: int) -> int:
        return tokens

    def formula(self, dtype: KvDtype, tp: int) -> str:
        return f"({self.kv_lora_rank} kv_lora_rank + {self.qk_rope_head_dim} qk_rope_head_dim) x {dtype.bytes:g} B (not split by tp)"


LayerKind = FullAttention | SlidingWindow | MultiLatentAttention


@dataclass(frozen=True)
class LayerGroup:
    """Layers of one identical kind, with their indices in the model."""

    layer: LayerKind
    indices: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class ModelSpec:
    """A model reduced to the facts that decide its serving memory. Built once from a config.json."""

    name: str
    source: str  # "catalog", "path" or "hf-cache"
    model_type: str
    dtype: str  # canonical weight/activation dtype of the checkpoint, e.g. "bf16"
    layers: tuple[LayerKind, ...]
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int | None
    parameters: int  # what the engine loads for text generation
    parameters_source: str  # "catalog" (a published count) or "config" (counted from the architecture)
    checkpoint_parameters: int = 0  # what the checkpoint stores (published, or counted)
    mtp_parameters: int = 0  # multi-token-prediction layers in the checkpoint, not loaded without MTP speculation
    vision_parameters: int = 0  # vision tower and projector (counted), loaded with the model
    expert_parameters: int = 0  # weights inside routed MoE experts (their own quantization may apply)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    quantization: dict | None = None  # the config's quantization_config, as given
    architectures: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    source_path: str | None = None
    notes: tuple[str, ...] = field(default=())  # how ambiguous config fields were read

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_kv_heads(self) -> int:
        return max(layer.num_kv_heads for layer in self.layers)

    @property
    def head_dim(self) -> int:
        return max(layer.head_dim for layer in self.layers)

    @property
    def is_mla(self) -> bool:
        return any(layer.kind == "mla" for layer in self.layers)

    @property
    def sliding_window(self) -> int | None:
        windows = [layer.window for layer in self.layers if layer.kind == "sliding"]
        return max(windows) if windows else None

    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """Identical layers gathered, in order of first appearance."""
        indices: dict[LayerKind, list[int]] = {}
        for index, layer in enumerate(self.layers):
            indices.setdefault(layer, []).append(index)
        return tuple(LayerGroup(layer, tuple(found)) for layer, found in indices.items())

    def layer_pattern(self) -> str:
        """Human summary of the layer kinds, e.g. 'sliding 4096 on 21 of 42 layers (every 2nd from 0)'."""
        groups = self.layer_groups()
        if len(groups) == 1:
            layer = groups[0].layer
            if layer.kind == "sliding":
                return f"sliding {layer.window} on all {self.num_layers} layers"
            return f"{layer.kind} on all {self.num_layers} layers"
        parts = []
        for group in groups:
            label = f"sliding {group.layer.window}" if group.layer.kind == "sliding" else group.layer.kind
            parts.append(f"{label} on {group.count} of {self.num_layers}{_stride_note(group.indices)}")
        return "; ".join(parts)


def _stride_note(indices: tuple[int, ...]) -> str:
    if len(indices) < 2:
        return f" (layer {indices[0]})"
    stride = indices[1] - indices[0]
    if all(b - a == stride for a, b in itertools.pairwise(indices)):
        return f" (every {stride} from {indices[0]})" if stride > 1 else f" (layers {indices[0]}-{indices[-1]})"
    return ""
