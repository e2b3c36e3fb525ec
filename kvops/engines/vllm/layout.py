"""vLLM's KV cache layout (0.32.0): the spec of each layer, the groups it forms for a model, its block pool, and
what one request holds.

Mirrors the installed engine:
- specs: every cache a layer keeps becomes one spec (`kv_cache_interface`): full attention, sliding window,
  chunked local attention (Llama 4), MLA, the sparse-attention indexer (an MLA-type spec of fp8 keys), and the
  recurrent state of Mamba-1 / Mamba-2 / Gated DeltaNet layers (`MambaSpec`: one page holds a sequence's whole state).
- hybrid state models: before the specs are built, `Platform._align_hybrid_block_size` raises the attention block
  size until an attention page holds the largest state page, and pads the state page to the attention page
  (block sizes such as 528 on a GPU); the state pages a request holds follow the mamba cache mode ("align", the
  default with prefix caching: 2, and from 0.32 one more for Mamba-2's prefill checkpoint; "none": 1; "all", 0.12
  to 0.31: one per block of tokens), plus one per speculative token (the mode itself: plan.mamba_cache_mode).
- grouping (`kv_cache_utils.get_kv_cache_groups`): identical specs form one group; specs of one type (all
  full-type: full, MLA, indexer, or all one sliding window, ...) with different page sizes form one group whose
  block is the sum of their pages; otherwise (hybrid) pages are unified (smaller attention pages get a larger
  block size, state pages are padded) and each kind is split into groups of `group_size` layers (the smallest
  kind's count, or the largest when it is under 1.5x the smallest) as `layers[i::num_groups]`; every group shares
  one block pool and one block is the largest group's pages side by side (`_get_kv_cache_bytes_per_block`).
- the pool: `num_blocks = kv_bytes // bytes_per_block`; the block pool keeps block 0 as the null block;
  `get_max_concurrency_for_kv_cache_config` sums each group's blocks for one request at `max_model_len` and
  `kv_cache_size_tokens = int(num_blocks / blocks_per_request * max_model_len)`.
- without the hybrid manager (`--disable-hybrid-kv-cache-manager`, or EAGLE with chunked attention) sliding and
  chunked layers are allocated as full attention.
The per-layer, per-token cost comes from the ModelSpec's layer kinds (kvops.model.spec), not from here.
"""

from __future__ import annotations

from dataclasses import replace
from math import lcm

from kvops.dtypes import KV_DTYPES, KvDtype, canonical_dtype_name
from kvops.errors import KvopsError, UsageError
from kvops.formula import check_tp
from kvops.frozen import frozen
from kvops.model.spec import LayerKind, MambaState, ModelSpec, MultiLatentAttention, RecurrentState

GPU_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE (FlashAttention, FlashInfer, Triton) through 0.33
GPU_MLA_BLOCK_SIZE = 64  # FlashMLA's only kernel block size
CPU_BLOCK_SIZE = 128  # platforms/cpu.py when the user gives none
CPU_MLA_BLOCK_SIZE = 16  # the reference CPU MLA kernel (a host without AMX tiles)
KERNEL_BLOCK_ALIGNMENT = {"gpu": 16, "cpu": 32}  # FlashAttention MultipleOf(16); CPU_ATTN MultipleOf(32)
HYBRID_MLA_BLOCK_ALIGNMENT = 128  # hybrid MLA/Mamba models: a multiple of 128 (`_align_hybrid_block_size`)
MAMBA_STATE_PAGES = {"align": 2, "none": 1, "all": 0}  # MambaSpec.max_memory_usage_bytes per mamba_cache_mode
# ('all', V1 0.12-0.31: a state page per block of tokens, cdiv(max_model_len, block_size), beside these)
# Mamba-2 mixers (MambaMixer2.get_kv_cache_spec) keep one more page in align mode: the prefill checkpoint
MAMBA2_CHECKPOINT_PAGES = 1
# Gated DeltaNet layers under FlashInfer's GDN prefill (vLLM 0.33+) keep one too, exported at offsets that are
# multiples of 64 tokens, so blocks are a multiple of 64 (FLASHINFER_GDN_CHECKPOINT_ALIGNMENT, gdn_attn.py)
GDN_CHECKPOINT_PAGES = 1
GDN_CHECKPOINT_ALIGNMENT = 64
FULL_TYPE = ("full", "mla", "indexer")
# Sparse MLA (DeepSeek-V3.2) with an 8-bit cache is stored as fp8_ds_mla where FLASHMLA_SPARSE serves it: 512 fp8
# latent values, 4 fp32 scales and 64 bf16 rotary values per token (`_canonicalize_sparse_mla_kv_cache_dtype`,
# model_executor/layers/attention/mla_attention.py); FLASHINFER_MLA_SPARSE keeps plain fp8 (576 B)
FP8_DS_MLA_BYTES = 656  # FullAttentionSpec and its subclasses: one uniform type


def default_block_size(
    spec: ModelSpec,
    device: str,
    cpu_amx: bool = False,
    gpu_block: int = GPU_BLOCK_SIZE,
    mla_block: int = GPU_MLA_BLOCK_SIZE,
) -> int:
    """vLLM's block size when the user gives none: on a GPU the release's default (`gpu_block`: 16, 64 from 0.34),
    which FlashAttention, FlashInfer and Triton take as it is; for dense MLA the block of the GPU's MLA backend
    (`mla_block`: releases.py gpu_mla_block_size); sparse MLA 64, which the indexer's kernel requires
    (DeepseekV32IndexerBackend.get_supported_kernel_block_sizes, v1/attention/backends/mla/indexer.py: [64] on
    CUDA) and every sparse backend runs. On the CPU build an MLA model takes the reference MLA kernel's 16 unless
    the host has AMX tiles, where vLLM runs its AMX MLA kernel at the default 128
    (`CpuPlatform.check_and_update_config`, vllm/platforms/cpu.py: `torch.cpu._is_amx_tile_supported()` on x86)."""
    if device == "cpu":
        return CPU_MLA_BLOCK_SIZE if spec.is_mla and not cpu_amx else CPU_BLOCK_SIZE
    if not spec.is_mla:
        return gpu_block
    return max(GPU_MLA_BLOCK_SIZE, gpu_block) if spec.is_sparse_mla else mla_block


@frozen
class LayoutOptions:
    """The engine settings that change the layout besides dtype, tp and block size."""

    device: str = "gpu"
    hybrid_manager: bool = True  # False: --disable-hybrid-kv-cache-manager (or vLLM turned it off)
    block_size_given: bool = False  # the user passed --block-size
    mamba_cache_mode: str = "align"  # with prefix caching on (hybrid models: default from 0.28.0); "none" without
    mamba_cache_dtype: str = "auto"  # --mamba-cache-dtype (the conv state)
    mamba_ssm_cache_dtype: str = "auto"  # --mamba-ssm-cache-dtype
    cpu_avx512_bf16: bool = False  # the CPU build's host has AVX-512 BF16 (kvops/cpu_features.py)
    speculative_tokens: int = 0  # num_speculative_tokens: extra state pages and conv rows
    mamba2_prefill_checkpoint: bool = True  # align mode: a Mamba-2 mixer's prefill checkpoint page (vLLM 0.32+)
    # align mode: Gated DeltaNet layers' prefill checkpoint page and 64-token blocks (FlashInfer's GDN prefill, 0.33+)
    gdn_prefill_checkpoint: bool = False
    # layers that keep the model's own KV dtype (kv_cache_dtype_skip_layers: TurboQuant's boundary layers)
    unquantized_layers: frozenset[int] = frozenset()
    dcp: int = 1  # --decode-context-parallel-size: a block's tokens spread over this many ranks (check_dcp)
    fp8_ds_mla: bool = True  # sparse MLA's 8-bit cache as fp8_ds_mla (FLASHMLA_SPARSE), not plain fp8 (FlashInfer's)
    ds_mla_always: bool = False  # sparse MLA stored as fp8_ds_mla whatever the cache dtype (SM120's FlashInfer)


# --- one layer's spec --------------------------------------------------------------------------------------


@frozen
class CacheSpec:
    """One layer's KV cache spec as vLLM builds it (the page of one block, and how many blocks a request needs)."""

    kind: str  # "full", "sliding", "chunked", "mla", "indexer" or "mamba"
    page_bytes: int
    block_size: int
    window: int | None = None  # sliding window, or the attention chunk
    state_pages: int = 0  # mamba: pages one request holds (beside one per block of tokens in 'all' mode)
    state_per_block: bool = False  # mamba cache mode 'all': a state page per block of tokens
    checkpoint_pages: int = 0  # mamba, align mode: of state_pages, the prefill checkpoint's (a Mamba-2 mixer's)

    @property
    def uniform_type(self) -> tuple:
        """What vLLM's UniformTypeKVCacheSpecs requires to be the same across layers of one group."""
        if self.kind in FULL_TYPE:
            return ("full", self.block_size)
        return (
            self.kind,
            self.block_size,
            self.window,
            self.state_pages,
            self.state_per_block,
            self.page_bytes if self.kind == "mamba" else 0,
        )

    @property
    def span(self) -> int:
        """The tokens a sliding (its window) or chunked (its chunk) group keeps."""
        if self.window is None:
            raise ValueError(f"a {self.kind} cache spec without its window")
        return self.window

    def admission_blocks(self, max_model_len: int, in_flight: int) -> int:
        """Blocks one request at `max_model_len` may hold (`cdiv(max_memory_usage_bytes, page_size_bytes)`)."""
        if self.kind == "mamba":
            return self.state_pages + (-(-max_model_len // self.block_size) if self.state_per_block else 0)
        if self.kind == "sliding":
            return -(-min(self.span - 1 + in_flight, max_model_len) // self.block_size) + 1
        if self.kind == "chunked":
            return -(-min(self.span + in_flight, max_model_len) // self.block_size)
        return -(-max_model_len // self.block_size)

    def held_blocks(self, tokens: int) -> int:
        """Blocks a running sequence of `tokens` tokens holds in steady decode (blocks out of reach freed)."""
        if self.kind == "mamba":
            return self.state_pages + (-(-tokens // self.block_size) if self.state_per_block else 0)
        full = -(-tokens // self.block_size)
        if self.kind == "sliding" and tokens > self.span:
            return min(full, -(-self.span // self.block_size) + 1)
        if self.kind == "chunked":
            return min(full, -(-self.span // self.block_size))
        return full


# --- KV cache groups ------------------------------------------------------------------------------------


@frozen
class KVCacheGroup:
    """One vLLM KV cache group: layers sharing a block table (of one spec, or of one uniform type)."""

    kind: str  # "full", "sliding", "chunked", "mla", "indexer", "mamba", or "full" for a uniform-type group
    layers: tuple[int, ...]
    layer_pages: tuple[int, ...]  # each layer's page of one block
    spec: CacheSpec  # the spec that decides the group's blocks per request

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def window(self) -> int | None:
        return self.spec.window

    @property
    def page_bytes(self) -> int:
        return self.layer_pages[0]

    @property
    def bytes_per_block(self) -> int:
        return sum(self.layer_pages)

    def admission_blocks(self, max_model_len: int, in_flight: int) -> int:
        return self.spec.admission_blocks(max_model_len, in_flight)

    def prefill_blocks(self, tokens: int, in_flight: int) -> int:
        """Blocks a request of `tokens` tokens may hold while its prompt is computed: a sliding group also keeps
        the tokens in flight behind its window (`SlidingWindowSpec`), as the KV guard counts a request it admits
        (plugins/kvops_vllm/admission.py, GroupShape.max_blocks)."""
        full = -(-tokens // self.block_size)
        if self.kind == "sliding":
            return min(full, -(-(self.spec.span - 1 + in_flight) // self.block_size) + 1)
        return full

    def held_blocks(self, tokens: int) -> int:
        return self.spec.held_blocks(tokens)


@frozen
class KVCacheLayout:
    groups: tuple[KVCacheGroup, ...]
    group_size: int
    padding_layers: int
    hybrid: bool  # several groups share the pool (the hybrid KV cache manager)
    attention_block_size: int = 0  # the block size the attention layers use (raised for state models)

    @property
    def block_size(self) -> int:
        return min(group.block_size for group in self.groups)

    @property
    def bytes_per_block(self) -> int:
        """One block of the shared pool: the largest group's pages side by side."""
        return max(group.bytes_per_block for group in self.groups)

    @property
    def has_state(self) -> bool:
        return any(group.kind == "mamba" for group in self.groups)

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
        with the same prompt); sliding, chunked and state groups are counted per sequence.
        """
        blocks = 0
        for group in self.groups:
            own = group.held_blocks(total_tokens)
            if sequences > 1 and prefix_caching and group.kind in FULL_TYPE:
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
            label = f"{group.kind} {group.window}" if group.window else group.kind
            parts.append(f"{label} x{len(group.layers)}")
        text = f"{len(self.groups)} group{'s' if len(self.groups) > 1 else ''} ({', '.join(parts)})"
        if self.padding_layers:
            text += f", {self.padding_layers} padding layer{'s' if self.padding_layers > 1 else ''}"
        return text


def kv_layout(
    spec: ModelSpec,
    dtype: KvDtype,
    tp: int,
    block_size: int,
    hybrid_manager: bool = True,
    options: LayoutOptions | None = None,
) -> KVCacheLayout:
    """The KV cache groups vLLM forms for this model on one tensor-parallel rank."""
    check_tp(spec, tp)
    options = options or LayoutOptions(hybrid_manager=hybrid_manager)
    attention_block = aligned_block_size(spec, dtype, tp, block_size, options)
    plain = KV_DTYPES.get(spec.dtype, dtype)
    specs = [
        (
            index,
            layer_spec(
                spec, layer, plain if index in options.unquantized_layers else dtype, tp, attention_block, options
            ),
        )
        for index, layer in spec.caches()
    ]
    specs.sort(key=lambda item: item[0])
    if not options.hybrid_manager:
        specs = _promoted(specs)
    kinds = {cache for _, cache in specs}
    if len(kinds) == 1:
        only = next(iter(kinds))
        layers = tuple(index for index, _ in specs)
        return KVCacheLayout((_group(only, layers, [only] * len(layers)),), len(layers), 0, False, attention_block)
    if len({cache.uniform_type for cache in kinds}) == 1:
        group = _group(specs[0][1], tuple(i for i, _ in specs), [cache for _, cache in specs])
        return KVCacheLayout((group,), len(specs), 0, False, attention_block)
    return _hybrid_layout(spec, _unified_pages(spec, specs), attention_block)


def layer_spec(
    spec: ModelSpec, layer: LayerKind, dtype: KvDtype, tp: int, block_size: int, options: LayoutOptions
) -> CacheSpec:
    if isinstance(layer, RecurrentState):
        mode = options.mamba_cache_mode
        checkpoint = checkpoint_pages(layer, options) if mode == "align" else 0
        pages = MAMBA_STATE_PAGES[mode] + options.speculative_tokens + checkpoint
        page = state_page_bytes(spec, layer, tp, options)
        return CacheSpec(
            "mamba", page, block_size, state_pages=pages, state_per_block=mode == "all", checkpoint_pages=checkpoint
        )
    window = getattr(layer, "window", None) or getattr(layer, "chunk", None)
    per_token = layer.bytes_per_token(dtype, tp)
    if isinstance(layer, MultiLatentAttention) and layer.sparse and _ds_mla(options, dtype):
        per_token = FP8_DS_MLA_BYTES
    # under decode context parallelism a block spans dcp x block_size tokens, each rank's page holding block_size of
    # them (`resolve_dcp_kv_block_size`, v1/core/kv_cache_utils.py; `max_num_blocks_per_req`, v1/kv_cache_interface.py)
    return CacheSpec(layer.kind, block_size * per_token, block_size * options.dcp, window or None)


def _ds_mla(options: LayoutOptions, dtype: KvDtype) -> bool:
    stored = options.ds_mla_always or (dtype.bits == 8 and options.fp8_ds_mla)
    return options.device == "gpu" and stored


def checkpoint_pages(layer: RecurrentState, options: LayoutOptions) -> int:
    """The prefill checkpoint pages a state layer keeps in align mode: a Mamba-2 mixer's (MambaMixer2.
    get_kv_cache_spec, 0.32+), a Gated DeltaNet layer's under FlashInfer's GDN prefill (GatedDeltaNetAttention.
    get_kv_cache_spec, 0.33+)."""
    if not isinstance(layer, MambaState):
        return 0
    if layer.variant == "mamba2" and options.mamba2_prefill_checkpoint:
        return MAMBA2_CHECKPOINT_PAGES
    if layer.variant == "gdn" and options.gdn_prefill_checkpoint:
        return GDN_CHECKPOINT_PAGES
    return 0


def check_dcp(spec: ModelSpec, tp: int, dcp: int) -> None:
    """What kvops lays out of --decode-context-parallel-size: vLLM's own rule (it divides tp: `ParallelConfig`,
    config/parallel.py), on models whose every cache is a dense MLA latent, which every tp rank holds whole and DCP
    splits by tokens. (For GQA the heads a rank holds depend on DCP too, and kvops has not read that rule.)"""
    if dcp == 1:
        return
    if tp % dcp:
        raise UsageError(
            f"--decode-context-parallel-size {dcp} must divide --tensor-parallel-size {tp}, as vLLM requires"
        )
    caches = [layer for _, layer in spec.caches()]
    if not caches or not all(isinstance(layer, MultiLatentAttention) and not layer.sparse for layer in caches):
        raise UsageError(
            f"--decode-context-parallel-size: kvops lays it out for models whose every layer caches a dense MLA "
            f"latent (DeepSeek-V2/V3/R1, Kimi-K2); {spec.name} does not; plan it without, or measure the run"
        )


def state_dtypes(spec: ModelSpec, layer: RecurrentState, options: LayoutOptions) -> tuple[float, float]:
    """Bytes per value of the conv and SSM states in vLLM: --mamba-cache-dtype for the conv state (auto: the
    model's dtype), --mamba-ssm-cache-dtype for the SSM state (auto: the dtype the model's config class declares,
    Nemotron-H float32 by default, else the conv state's). vLLM's CPU build on a host with AVX-512 BF16 resets the
    SSM state to float32 but where its accelerated Gated DeltaNet kernel keeps an explicit 16-bit dtype
    (`CpuPlatform.check_and_update_config` and `_cpu_mamba_backend`, platforms/cpu.py, 0.32 and 0.34); on a host
    without it the state keeps the dtype above."""
    conv = _dtype_bytes(options.mamba_cache_dtype) or KV_DTYPES[spec.dtype].bytes
    ssm = _dtype_bytes(options.mamba_ssm_cache_dtype)
    explicit_half = ssm == 2
    if ssm is None:
        declared = layer.ssm_dtype or ("float32" if spec.model_type == "nemotron_h" else "")
        ssm = _dtype_bytes(declared) or conv
    gdn_kept = explicit_half and isinstance(layer, MambaState) and layer.variant == "gdn"
    if options.device == "cpu" and options.cpu_avx512_bf16 and not gdn_kept:
        ssm = 4
    return conv, ssm


def _dtype_bytes(name: str) -> float | None:
    canonical = canonical_dtype_name(name) if name and name != "auto" else None
    return KV_DTYPES[canonical].bytes if canonical else None


def state_page_bytes(spec: ModelSpec, layer: RecurrentState, tp: int, options: LayoutOptions) -> int:
    conv, ssm = state_dtypes(spec, layer, options)
    return layer.state_bytes(conv, ssm, tp, options.speculative_tokens)


def aligned_block_size(spec: ModelSpec, dtype: KvDtype, tp: int, block_size: int, options: LayoutOptions) -> int:
    """The attention block size: for models with recurrent state, raised until one attention page holds the
    largest state page (`_align_hybrid_block_size`), a multiple of the kernel block alignment, and in align mode of
    the state layers' prefill checkpoint alignment where every one of them exports checkpoints (0.33+:
    `get_mamba_prefill_checkpoint_alignment`, model_executor/layers/mamba/abstract.py)."""
    states = [layer for _, layer in spec.caches() if isinstance(layer, RecurrentState)]
    attention = spec.attention_layers()
    if not states or not attention:
        return block_size
    state_page = max(state_page_bytes(spec, layer, tp, options) for layer in states)
    per_token = attention[0].bytes_per_token(dtype, tp)
    kernel = KERNEL_BLOCK_ALIGNMENT[options.device]
    alignment = max(kernel, block_size)
    if spec.is_mla:
        alignment = max(alignment, HYBRID_MLA_BLOCK_ALIGNMENT)
    if options.mamba_cache_mode == "align" and all(_gdn_checkpoint(layer, options) for layer in states):
        alignment = lcm(alignment, GDN_CHECKPOINT_ALIGNMENT)
    aligned = alignment * -(-state_page // (alignment * per_token))
    aligned = kernel * -(-aligned // kernel)
    return max(block_size, aligned)


def gdn_key_head_dim(spec: ModelSpec) -> int:
    """The key head dim of the model's Gated DeltaNet layers (vLLM's head_k_dim; 0 without such layers)."""
    return max(
        (layer.group_dim for _, layer in spec.caches() if isinstance(layer, MambaState) and layer.variant == "gdn"),
        default=0,
    )


def _gdn_checkpoint(layer: RecurrentState, options: LayoutOptions) -> bool:
    return isinstance(layer, MambaState) and layer.variant == "gdn" and options.gdn_prefill_checkpoint


def _promoted(specs: list[tuple[int, CacheSpec]]) -> list[tuple[int, CacheSpec]]:
    """Without the hybrid manager, sliding and chunked layers are allocated as full attention (when the model has
    full attention layers too: `_promote_local_kv_cache_specs`)."""
    if not any(cache.kind in FULL_TYPE for _, cache in specs):
        return specs
    return [
        (index, replace(cache, kind="full", window=None) if cache.kind in ("sliding", "chunked") else cache)
        for index, cache in specs
    ]


def _unified_pages(spec: ModelSpec, specs: list[tuple[int, CacheSpec]]) -> list[tuple[int, CacheSpec]]:
    """`unify_kv_cache_spec_page_size`: a smaller attention page takes a proportionally larger block size (or is
    padded when it does not divide the largest), a state page is padded; MLA pages must divide."""
    largest = max(cache.page_bytes for _, cache in specs)
    unified = []
    for index, cache in specs:
        if cache.page_bytes == largest:
            unified.append((index, cache))
        elif cache.kind == "mamba" or (largest % cache.page_bytes and cache.kind not in ("mla", "indexer")):
            unified.append((index, replace(cache, page_bytes=largest)))
        elif largest % cache.page_bytes == 0:
            ratio = largest // cache.page_bytes
            unified.append((index, replace(cache, page_bytes=largest, block_size=cache.block_size * ratio)))
        else:
            raise KvopsError(
                f"{spec.name}: its MLA and other layers have page sizes vLLM cannot unify ({cache.page_bytes} B and {largest} B); not modelled"
            )
    return unified


def _hybrid_layout(spec: ModelSpec, specs: list[tuple[int, CacheSpec]], attention_block: int) -> KVCacheLayout:
    buckets: dict[CacheSpec, list[int]] = {}
    for index, cache in specs:
        buckets.setdefault(cache, []).append(index)
    sizes = [len(layers) for layers in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups, padding = [], 0
    for cache, layers in buckets.items():
        if len(layers) % group_size:
            padding += group_size - len(layers) % group_size
        count = -(-len(layers) // group_size)
        for i in range(count):
            members = tuple(layers[i::count])
            groups.append(_group(cache, members, [cache] * len(members)))
    return KVCacheLayout(tuple(groups), group_size, padding, True, attention_block)


def _group(cache: CacheSpec, layers: tuple[int, ...], members: list[CacheSpec]) -> KVCacheGroup:
    return KVCacheGroup(cache.kind, layers, tuple(member.page_bytes for member in members), cache)


def project(layout: KVCacheLayout, layers: set[int]) -> KVCacheLayout:
    """The groups as one pipeline stage holds them: each group keeps only the stage's layers
    (`_project_kv_cache_groups_to_worker`); the stage's block is its largest group's pages side by side."""
    groups = []
    for group in layout.groups:
        kept = [(layer, page) for layer, page in zip(group.layers, group.layer_pages) if layer in layers]
        groups.append(replace(group, layers=tuple(i for i, _ in kept), layer_pages=tuple(p for _, p in kept)))
    return replace(layout, groups=tuple(groups))


# --- speculative decoding ------------------------------------------------------------------------------------


def with_draft_layers(spec: ModelSpec, draft_caches: list[LayerKind]) -> ModelSpec:
    """The target with the drafter's KV layers after its own (vLLM registers them last; they share the pool)."""
    if not draft_caches:
        return spec
    start = max((index for index, _ in spec.caches()), default=-1) + 1
    extra = tuple((start + offset, layer) for offset, layer in enumerate(draft_caches))
    return replace(spec, extra_caches=(*spec.extra_caches, *extra))


def mtp_caches(spec: ModelSpec) -> list[LayerKind]:
    """MTP modules are decoder layers of the target's full-attention kind (with the indexer beside sparse MLA),
    one per module the checkpoint carries (num_nextn_predict_layers / mtp_num_hidden_layers)."""
    kinds = [layer for _, layer in spec.caches() if layer.kind in ("full", "mla")]
    if not kinds or not spec.mtp_layers:
        return []
    attention = kinds[-1]
    indexer = [layer for _, layer in spec.extra_caches if layer.kind == "indexer"][:1]
    return [cache for _ in range(spec.mtp_layers) for cache in (attention, *indexer)]


# --- the block pool -------------------------------------------------------------------------------------------


@frozen
class Pool:
    """What vLLM reports after sizing: `num_gpu_blocks`, `kv_cache_size_tokens`, the concurrency at max_model_len.

    The release decides three details (releases.py): V0 has no null block and counts tokens as blocks x block
    size; V1 through 0.20.0 reports `num_blocks // groups x block_size` tokens, later `int(concurrency x max_model_len)`.
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
    tokens_by_concurrency: bool = True  # 'GPU KV cache size' as concurrency x max_model_len (V1 0.20.1+)

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
    num_blocks: int | None = None,
) -> Pool:
    """The pool for `kv_bytes` per GPU, or of `num_blocks` (pipeline stages: the smallest stage's count)."""
    return Pool(
        layout.num_blocks(kv_bytes) if num_blocks is None else num_blocks,
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


VMM_GRANULE = 2 << 20  # cuMemGetAllocationGranularity's minimum on NVIDIA GPUs: physical memory is mapped in 2 MiB


def committed_blocks(layout: KVCacheLayout, kv_bytes: int, granule: int = VMM_GRANULE) -> int:
    """The blocks an extensible KV cache commits within `kv_bytes`: every layer slot of a block is its own segment
    (a block-compact, layer-outermost layout), each mapped in whole granules (`ExtensibleKVCache.blocks_within` and
    `physical_bytes_for`, v1/worker/extensible_kv_cache.py, 0.34.0)."""
    strides = max(layout.groups, key=lambda group: group.bytes_per_block).layer_pages

    def physical(blocks: int) -> int:
        return sum(-(-blocks * stride // granule) * granule for stride in strides)

    blocks = max(0, kv_bytes // layout.bytes_per_block)
    while blocks > 0 and physical(blocks) > kv_bytes:
        blocks -= 1
    return blocks


def kv_bytes_needed(layout: KVCacheLayout, blocks: int) -> int:
    """KV memory for `blocks` usable blocks (the null block added)."""
    return (blocks + 1) * layout.bytes_per_block
