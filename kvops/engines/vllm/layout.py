"""vLLM's KV cache layout (0.32.0): the groups it forms for a model, its block pool, and what one request holds.

Mirrors the installed engine:
- grouping: `kv_cache_utils.get_kv_cache_groups`. Identical layers form one group; hybrid models (Gemma 2/3,
  gpt-oss) get one bucket per layer kind, split into groups of `group_size` layers (the smallest bucket, or the
  largest when it is under 1.5x the smallest) as `layers[i::num_groups]`; every group shares one block pool and
  one block is `group_size` per-layer pages (`_get_kv_cache_bytes_per_block`).
- blocks: `num_blocks = kv_bytes // bytes_per_block`; the block pool keeps block 0 as the null block.
- the pool: `get_max_concurrency_for_kv_cache_config` sums each group's blocks for one request at
  `max_model_len` (full: `cdiv(L, bs)`; sliding: `cdiv(min(W - 1 + in_flight, L), bs) + 1`, `SlidingWindowSpec`);
  `kv_cache_size_tokens = int(num_blocks / blocks_per_request * max_model_len)`.
The per-layer, per-token cost comes from the ModelSpec's layer kinds (kvops.model.spec), not from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvops.dtypes import KvDtype
from kvops.errors import KvopsError
from kvops.formula import check_tp
from kvops.model.spec import LayerKind, ModelSpec

GPU_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE (FlashAttention, FlashInfer, Triton)
GPU_MLA_BLOCK_SIZE = 64  # FlashMLA's only kernel block size
CPU_BLOCK_SIZE = 128  # platforms/cpu.py when the user gives none
CPU_MLA_BLOCK_SIZE = 16  # the reference CPU MLA kernel


def default_block_size(spec: ModelSpec, device: str) -> int:
    if device == "cpu":
        return CPU_MLA_BLOCK_SIZE if spec.is_mla else CPU_BLOCK_SIZE
    return GPU_MLA_BLOCK_SIZE if spec.is_mla else GPU_BLOCK_SIZE


# --- KV cache groups ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCacheGroup:
    """One vLLM KV cache group: layers of one kind sharing a block table."""

    kind: str  # "full", "sliding" or "mla"
    layers: tuple[int, ...]
    page_bytes: int  # one layer, one block
    block_size: int
    window: int | None = None

    def admission_blocks(self, max_model_len: int, in_flight: int) -> int:
        """Blocks one request at `max_model_len` may hold (`max_memory_usage_bytes / page_size_bytes`)."""
        if self.kind == "sliding":
            return -(-min(self.window - 1 + in_flight, max_model_len) // self.block_size) + 1
        return -(-max_model_len // self.block_size)

    def prefill_blocks(self, tokens: int, in_flight: int) -> int:
        """Blocks a request of `tokens` tokens may hold while its prompt is computed: a sliding group also keeps
        the tokens in flight behind its window (`SlidingWindowSpec`), as the KV guard counts a request it admits
        (plugins/kvops_vllm/admission.py, GroupShape.max_blocks)."""
        full = -(-tokens // self.block_size)
        if self.kind == "sliding":
            return min(full, -(-(self.window - 1 + in_flight) // self.block_size) + 1)
        return full

    def held_blocks(self, tokens: int) -> int:
        """Blocks a running sequence of `tokens` tokens holds in steady decode (out-of-window blocks freed)."""
        full = -(-tokens // self.block_size)
        if self.kind == "sliding" and tokens > self.window:
            return min(full, -(-self.window // self.block_size) + 1)
        return full


@dataclass(frozen=True)
class KVCacheLayout:
    groups: tuple[KVCacheGroup, ...]
    group_size: int
    padding_layers: int
    hybrid: bool  # several groups share the pool (the hybrid KV cache manager)

    @property
    def block_size(self) -> int:
        return min(group.block_size for group in self.groups)

    @property
    def bytes_per_block(self) -> int:
        """One block of the shared pool: the largest group's pages side by side."""
        return max(len(group.layers) * group.page_bytes for group in self.groups)

    def num_blocks(self, kv_bytes: int) -> int:
        return kv_bytes // self.bytes_per_block

    def blocks_per_request(self, max_model_len: int, in_flight: int) -> int:
        return sum(group.admission_blocks(max_model_len, in_flight) for group in self.groups)

    def bytes_per_request(self, max_model_len: int, in_flight: int) -> int:
        """What vLLM's startup check needs for one request at `max_model_len`: its blocks across the groups, each
        a whole pool block, padding included (`_max_memory_usage_bytes_from_groups`)."""
        return self.blocks_per_request(max_model_len, in_flight) * self.bytes_per_block

    def blocks_held(
        self, prompt_tokens: int, total_tokens: int, sequences: int = 1, prefix_caching: bool = True
    ) -> int:
        """Blocks one request of `sequences` parallel sequences (n or beams) holds at `total_tokens` each.

        With prefix caching the prompt's full blocks are shared by the siblings (vLLM fans n out into n requests
        with the same prompt); sliding groups are counted per sequence.
        """
        blocks = 0
        for group in self.groups:
            own = group.held_blocks(total_tokens)
            if sequences > 1 and prefix_caching and group.kind != "sliding":
                shared = prompt_tokens // group.block_size
                blocks += shared + sequences * (own - shared)
            else:
                blocks += sequences * own
        return blocks

    def prefill_extra(self, total_tokens: int, in_flight: int) -> int:
        """Blocks one sequence holds above `blocks_held` while its prompt is computed (0 without sliding groups)."""
        return sum(
            max(0, group.prefill_blocks(total_tokens, in_flight) - group.held_blocks(total_tokens))
            for group in self.groups
        )

    def describe(self) -> str:
        parts = []
        for group in self.groups:
            label = f"sliding {group.window}" if group.kind == "sliding" else group.kind
            parts.append(f"{label} x{len(group.layers)}")
        text = f"{len(self.groups)} group{'s' if len(self.groups) > 1 else ''} ({', '.join(parts)})"
        if self.padding_layers:
            text += f", {self.padding_layers} padding layer{'s' if self.padding_layers > 1 else ''}"
        return text


def kv_layout(spec: ModelSpec, dtype: KvDtype, tp: int, block_size: int, hybrid_manager: bool = True) -> KVCacheLayout:
    """The KV cache groups vLLM forms for this model on one tensor-parallel rank."""
    check_tp(spec, tp)
    kinds = [_layer_key(layer, dtype, tp, block_size, hybrid_manager) for layer in spec.layers]
    buckets: dict[tuple, list[int]] = {}
    for index, key in enumerate(kinds):
        buckets.setdefault(key, []).append(index)
    if len(buckets) == 1:
        key, layers = next(iter(buckets.items()))
        return KVCacheLayout((_group(key, layers, block_size),), len(layers), 0, False)
    pages = {key[1] for key in buckets}
    if len(pages) > 1:
        raise KvopsError(
            f"{spec.name}: layer kinds with different page sizes are not modelled (vLLM pads or rescales them)"
        )
    sizes = [len(layers) for layers in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups, padding = [], 0
    for key, layers in buckets.items():
        if len(layers) % group_size:
            padding += group_size - len(layers) % group_size
        count = -(-len(layers) // group_size)
        groups.extend(_group(key, layers[i::count], block_size) for i in range(count))
    return KVCacheLayout(tuple(groups), group_size, padding, True)


def _layer_key(layer: LayerKind, dtype: KvDtype, tp: int, block_size: int, hybrid_manager: bool) -> tuple:
    page = block_size * layer.bytes_per_token(dtype, tp)
    if layer.kind == "sliding" and hybrid_manager:
        return ("sliding", page, layer.window)
    return ("mla" if layer.kind == "mla" else "full", page, None)


def _group(key: tuple, layers: list[int], block_size: int) -> KVCacheGroup:
    kind, page, window = key
    return KVCacheGroup(kind, tuple(layers), page, block_size, window)


# --- the block pool -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """What vLLM reports after sizing: `num_gpu_blocks`, `kv_cache_size_tokens`, the concurrency at max_model_len.

    The release decides three details (releases.py): V0 has no null block and counts tokens as blocks x block
    size; V1 before 0.20 reports `num_blocks // groups x block_size` tokens, later `int(concurrency x max_model_len)`.
    """

    num_blocks: int
    block_size: int
    blocks_per_request: int
    max_model_len: int
    bytes_needed: int = 0  # one request at max_model_len, as the startup check counts it
    kv_bytes: int = 0
    bytes_per_block: int = 0
    groups: int = 1
    null_block: bool = True  # V1's block pool keeps block 0 back
    tokens_by_concurrency: bool = True  # 'GPU KV cache size' as concurrency x max_model_len (V1 0.20+)

    @property
    def usable_blocks(self) -> int:
        return max(0, self.num_blocks - 1) if self.null_block else self.num_blocks

    @property
    def max_concurrency(self) -> float:
        if not self.null_block:  # V0: tokens the pool holds over max_model_len
            return self.num_blocks * self.block_size / self.max_model_len
        return self.num_blocks / self.blocks_per_request

    @property
    def kv_cache_size_tokens(self) -> int:
        if not self.null_block:
            return self.num_blocks * self.block_size
        if not self.tokens_by_concurrency:
            return self.num_blocks // self.groups * self.block_size
        return int(self.max_concurrency * self.max_model_len)

    @property
    def fits_one_request(self) -> bool:
        """The engine's startup check: V1 compares one request's bytes at max_model_len with the KV memory less the
        null block (`get_kv_cache_configs`: "Reserve the null block ... so auto-fit and the capacity check both plan
        against usable blocks"); V0 refuses a max_model_len above the tokens its blocks hold."""
        if not self.null_block:
            return self.max_model_len <= self.num_blocks * self.block_size
        return self.bytes_needed <= self.kv_bytes - self.bytes_per_block


def pool(
    layout: KVCacheLayout,
    kv_bytes: int,
    max_model_len: int,
    in_flight: int,
    null_block: bool = True,
    tokens_by_concurrency: bool = True,
) -> Pool:
    return Pool(
        layout.num_blocks(kv_bytes),
        layout.block_size,
        layout.blocks_per_request(max_model_len, in_flight),
        max_model_len,
        layout.bytes_per_request(max_model_len, in_flight),
        kv_bytes,
        layout.bytes_per_block,
        len(layout.groups),
        null_block,
        tokens_by_concurrency,
    )


def engine_max_model_len(layout: KVCacheLayout, kv_bytes: int, in_flight: int, upper: int, null_block: bool) -> int:
    """The longest max_model_len the engine accepts for this KV memory: what `--max-model-len auto` (-1) picks and
    the 'estimated maximum model length' of its error (V1 `_estimate_max_model_len_from_groups`: one request's
    blocks within the memory less the null block); V0 takes the tokens its blocks hold. 0 when not even one token
    fits."""
    if not null_block:
        return min(upper, layout.num_blocks(kv_bytes) * layout.block_size)

    def fits(length: int) -> bool:  # the null block held back, as the startup check does
        return layout.bytes_per_request(length, in_flight) <= kv_bytes - layout.bytes_per_block

    if kv_bytes <= 0 or not fits(1):
        return 0
    low, high = 1, upper
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def longest_context(layout: KVCacheLayout, usable_blocks: float, sequences: int, in_flight: int, upper: int) -> int:
    """Largest max_model_len whose `sequences` requests fit in `usable_blocks` (0 when not even one token does)."""

    def fits(length: int) -> bool:
        return sequences * layout.blocks_per_request(length, in_flight) <= usable_blocks

    if not fits(1):
        return 0
    low, high = 1, upper
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def kv_bytes_needed(layout: KVCacheLayout, blocks: int) -> int:
    """KV memory for `blocks` usable blocks (the null block added)."""
    return (blocks + 1) * layout.bytes_per_block
