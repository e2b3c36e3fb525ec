"""The KV-cache formula as pure arithmetic on a ModelSpec. No I/O, no engine knowledge.

    bytes = 2 x L x B x T x Hkv x D x s

L layers, B sequences (batch x beams), T cached tokens, Hkv KV heads (per GPU: max(1, Hkv // tp)), D head dim,
s bytes per value. Computed per layer group: a sliding-window layer caches min(T, W) tokens, a chunked local
layer min(T, C), an MLA layer kv_lora_rank + qk_rope_head_dim values per token whatever the tp, a sparse
indexer its fp8 key per token; a recurrent-state layer (Mamba-1, Mamba-2, Gated DeltaNet) adds a fixed state per
sequence and nothing per token. With a block size N (paged engines) each sequence holds ceil(tokens / N) x N
token slots per layer group.
"""

from __future__ import annotations

from math import ceil

from kvops.dtypes import KV_DTYPES, KvDtype, canonical_dtype_name
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.model.spec import LayerGroup, ModelSpec, RecurrentState

# Beam search is reported to cost 20-30% more than batch x beams; an estimate, never in the formula's figures.
BEAM_SEARCH_OVERHEAD_ESTIMATE = (0.20, 0.30)


def token_slots(tokens: int, block_size: int | None) -> int:
    """Token slots a sequence of `tokens` occupies: whole blocks when the cache is paged."""
    if not block_size:
        return tokens
    return ceil(tokens / block_size) * block_size


@frozen
class GroupCost:
    """One layer group's share of one sequence's cache, on one GPU."""

    kind: str
    layers: int
    kv_heads: int  # on this GPU
    head_dim: int
    window: int | None
    bytes_per_token: int  # all layers of the group, scales included
    scale_bytes_per_token: int
    cached_tokens: int
    token_slots: int
    formula: str
    state_bytes: int = 0  # recurrent state per sequence, all layers of the group

    @property
    def bytes(self) -> int:
        return self.bytes_per_token * self.token_slots + self.state_bytes


@frozen
class KVCost:
    """The cache of `batch x beams` sequences of `tokens` tokens each, per GPU."""

    dtype: KvDtype
    tp: int
    batch: int
    beams: int
    tokens: int
    block_size: int | None
    groups: tuple[GroupCost, ...]

    @property
    def effective_batch(self) -> int:
        return self.batch * self.beams

    @property
    def bytes_per_token(self) -> int:
        """One sequence, all layers, while every layer still grows (before any window is full)."""
        return sum(group.bytes_per_token for group in self.groups)

    @property
    def scale_bytes_per_token(self) -> int:
        return sum(group.scale_bytes_per_token for group in self.groups)

    @property
    def token_tax_bytes(self) -> int:
        """What one more generated token adds across the whole batch."""
        return self.effective_batch * self.bytes_per_token

    @property
    def sequence_bytes(self) -> int:
        return sum(group.bytes for group in self.groups)

    @property
    def total_bytes(self) -> int:
        return self.effective_batch * self.sequence_bytes

    @property
    def total_bytes_all_gpus(self) -> int:
        return self.total_bytes * self.tp


def state_dtype_bytes(layer: RecurrentState, model_dtype: str) -> tuple[float, float]:
    """Bytes per value of the conv and SSM states as the model declares them: its own dtype, the SSM state in the
    dtype its config names (Qwen3.5's mamba_ssm_dtype, Nemotron-H's mamba_ssm_cache_dtype) when it names one."""
    model = KV_DTYPES[model_dtype].bytes
    declared = canonical_dtype_name(layer.ssm_dtype) if layer.ssm_dtype else None
    return model, KV_DTYPES[declared].bytes if declared else model


def group_cost(
    group: LayerGroup,
    dtype: KvDtype,
    tp: int,
    tokens: int,
    block_size: int | None,
    apply_windows: bool = True,
    model_dtype: str = "bf16",
) -> GroupCost:
    layer = group.layer
    if isinstance(layer, RecurrentState):
        conv, ssm = state_dtype_bytes(layer, model_dtype)
        return GroupCost(
            kind=layer.kind,
            layers=group.count,
            kv_heads=0,
            head_dim=0,
            window=None,
            bytes_per_token=0,
            scale_bytes_per_token=0,
            cached_tokens=0,
            token_slots=0,
            formula=f"{layer.formula(dtype, tp)}, conv at {conv:g} B, ssm at {ssm:g} B, x {group.count} layers",
            state_bytes=group.count * layer.state_bytes(conv, ssm, tp),
        )
    cached = layer.cached_tokens(tokens) if apply_windows else tokens
    return GroupCost(
        kind=layer.kind,
        layers=group.count,
        kv_heads=layer.heads_per_gpu(tp),
        head_dim=layer.head_dim,
        window=getattr(layer, "window", None) or getattr(layer, "chunk", None),
        bytes_per_token=group.count * layer.bytes_per_token(dtype, tp),
        scale_bytes_per_token=group.count * layer.scale_bytes_per_token(dtype, tp),
        cached_tokens=cached,
        token_slots=token_slots(cached, block_size),
        formula=f"{layer.formula(dtype, tp)} x {group.count} layers",
    )


def kv_cost(
    spec: ModelSpec,
    *,
    tokens: int,
    dtype: KvDtype,
    batch: int = 1,
    beams: int = 1,
    tp: int = 1,
    block_size: int | None = None,
    apply_windows: bool = True,
) -> KVCost:
    """The formula for one workload point. `apply_windows=False` gives the cache as if no layer slid."""
    check_tp(spec, tp)
    groups = tuple(
        group_cost(group, dtype, tp, tokens, block_size, apply_windows, spec.dtype) for group in spec.layer_groups()
    )
    return KVCost(dtype=dtype, tp=tp, batch=batch, beams=beams, tokens=tokens, block_size=block_size, groups=groups)


def check_tp(spec: ModelSpec, tp: int) -> None:
    """The tensor-parallel sizes the engines accept: tp divides the attention heads, every layer's KV heads split
    or replicate evenly, and recurrent layers' heads split."""
    if tp_fits(spec, tp):
        return
    valid = [n for n in (1, 2, 4, 8, 16, 32, 64) if tp_fits(spec, n)]
    raise UsageError(
        f"--tp {tp} does not fit {spec.name}: {spec.num_attention_heads} attention heads and {_kv_heads_text(spec)} KV heads must split evenly; valid: {', '.join(map(str, valid))}"
    )


def tp_fits(spec: ModelSpec, tp: int) -> bool:
    if spec.num_attention_heads % tp:
        return False
    for _, layer in spec.caches():
        if isinstance(layer, RecurrentState):
            if not layer.splits(tp):
                return False
        elif layer.kind in ("full", "sliding", "chunked"):
            kv = layer.num_kv_heads
            if kv % tp if kv >= tp else tp % kv:
                return False
    return True


def _kv_heads_text(spec: ModelSpec) -> str:
    counts = sorted({layer.num_kv_heads for layer in spec.attention_layers()})
    return "/".join(map(str, counts)) if counts else "0"


def beam_search_estimate(total_bytes: int, beams: int) -> tuple[int, int] | None:
    """The reported +20-30% of beam search over batch x beams: (low, high), or None for beams 1."""
    if beams <= 1:
        return None
    low, high = BEAM_SEARCH_OVERHEAD_ESTIMATE
    return round(total_bytes * (1 + low)), round(total_bytes * (1 + high))


def context_warnings(spec: ModelSpec, tokens: int) -> list[str]:
    limit = spec.max_position_embeddings
    if limit and tokens > limit:
        return [
            f"{tokens:,} tokens exceed {spec.name}'s max_position_embeddings {limit:,}; the figures are computed, but the model was not trained for this length"
        ]
    return []


@frozen
class MemoryFit:
    """How much cache a memory size holds."""

    memory_bytes: int
    tokens: int  # cached tokens in all, at bytes_per_token each (plain arithmetic: no windows, no blocks)
    tokens_per_sequence: int | None  # longest T for the whole batch, windows and blocks applied; None = unbounded


def tokens_per_sequence_fit(
    spec: ModelSpec,
    memory: int,
    *,
    dtype: KvDtype,
    batch: int = 1,
    beams: int = 1,
    tp: int = 1,
    block_size: int | None = None,
) -> int | None:
    """The longest T whose cache for batch x beams sequences fits in `memory` bytes per GPU.

    None when every layer slides: past the windows the cache stops growing, so any T fits once the windows do.
    0 when not even one token per sequence fits.
    """

    def fits(tokens: int) -> bool:
        return (
            kv_cost(
                spec, tokens=tokens, dtype=dtype, batch=batch, beams=beams, tp=tp, block_size=block_size
            ).total_bytes
            <= memory
        )

    if not fits(1):
        return 0
    longest_window = spec.sliding_window or 0
    if all(layer.kind == "sliding" for layer in spec.layers) and fits(token_slots(longest_window, block_size)):
        return None
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:  # fits(low) and not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
