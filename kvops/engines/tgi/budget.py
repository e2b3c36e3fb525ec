"""TGI 3.x (text-generation-inference v3.3.7): how the shards size the KV pool, and what a request reserves.

From the source (huggingface/text-generation-inference @ db931fcf, one commit after v3.3.7):
- `launcher/src/main.rs::resolve_attention`: flashinfer (block size 1) when the config's head dim is 64, 128 or
  256 and the model is not falcon/deepseek_v2; otherwise flashdecoding (block 256) on compute capability >= 8,
  paged (block 16) below; `Dockerfile_amd` sets ATTENTION=paged on ROCm. `models/globals.py::BLOCK_SIZE`.
- `FlashCausalLM.warmup`: after loading the weights and running a worst-case prefill of
  `max_batch_prefill_tokens` tokens, `free = mem_get_info free - (1 - CUDA_MEMORY_FRACTION x TGI_WIGGLE_ROOM)
  x total` (`get_cuda_free_memory`, TGI_WIGGLE_ROOM 0.90); `num_blocks = free // (layers x BLOCK_SIZE x kv_heads
  x head_size x 2 x dtype_size)` (+ the warmup batch's own blocks, already counted as used); the router sets
  max batch total tokens to `num_blocks x BLOCK_SIZE`. The whole pool is allocated at startup.
- KV heads per shard `num_key_value_heads // num_shard` (must divide; MQA stays 1); no sliding-window saving:
  `Model.info` returns window_size None, every request reserves its full length.
- `backends/v3/src/queue.rs`: a request reserves `input + max_new_tokens + speculate - 1` tokens up front, with
  max_new_tokens cut to `DEFAULT_GENERATION_LENGTH` = 1024 per round (`router/src/validation.rs`); no preemption,
  requests wait. Block 0 is kept for health checks (`block_allocator.rs`, `radix.rs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import floor

from kvops.dtypes import KvDtype
from kvops.engines import common
from kvops.errors import UsageError
from kvops.model.checkpoint import Parallel
from kvops.model.spec import ModelSpec
from kvops.plan import PlanInputs, Term

TGI_WIGGLE_ROOM = 0.90  # server/text_generation_server/models/globals.py
DEFAULT_CUDA_MEMORY_FRACTION = 1.0  # launcher --cuda-memory-fraction
DEFAULT_MAX_BATCH_PREFILL_TOKENS = 4096  # launcher fallback when no FLOPs-based value applies
DEFAULT_MAX_CONCURRENT_REQUESTS = 128
DEFAULT_GENERATION_LENGTH = 1024  # router/src/validation.rs
BLOCK_SIZES = {"flashinfer": 1, "flashdecoding": 256, "paged": 16}
CHUNKING_ATTENTION = ("flashinfer", "flashdecoding")  # Model.__init__: prefill chunking only with these
KV_CACHE_DTYPES = ("fp8_e4m3fn", "fp8_e5m2")  # launcher enum KVCacheDtype


@dataclass(frozen=True)
class Attention:
    backend: str  # flashinfer | flashdecoding | paged
    prefix_caching: bool
    reason: str
    speculate: int = 0  # --speculate: the launcher turns prefill chunking off

    @property
    def block_size(self) -> int:
        return BLOCK_SIZES[self.backend]

    @property
    def supports_chunking(self) -> bool:
        return self.backend in CHUNKING_ATTENTION and not self.speculate


def resolve_attention(spec: ModelSpec, vendor: str) -> Attention:
    if vendor == "amd":
        return Attention("paged", False, "ROCm image (Dockerfile_amd) sets ATTENTION=paged, PREFIX_CACHING=0")
    head_dim = None if spec.is_mla else spec.head_dim
    if spec.model_type in ("falcon", "deepseek_v2"):
        return Attention("flashdecoding", True, f"launcher forces flashdecoding for {spec.model_type}")
    if head_dim in (64, 128, 256):
        return Attention("flashinfer", True, f"head dim {head_dim} is supported by flashinfer")
    return Attention(
        "flashdecoding",
        False,
        f"head dim {'unknown' if head_dim is None else head_dim} is not 64/128/256: flashdecoding, no prefix caching",
    )


def tgi_kv_dtype(dtype: KvDtype, model_dtype: str) -> str | None:
    """The `--kv-cache-dtype` value, or None for the model's own dtype (TGI has no 'auto' value)."""
    if dtype.bits == 16 and dtype.name == model_dtype:
        return None
    if dtype.bits >= 16:
        raise UsageError(
            f"--kv-dtype {dtype.name}: TGI keeps the KV cache in the model dtype ({model_dtype}); its --kv-cache-dtype takes only {', '.join(KV_CACHE_DTYPES)}"
        )
    if dtype.name in ("fp8", "fp8_e4m3"):
        return "fp8_e4m3fn"
    if dtype.name == "fp8_e5m2":
        return "fp8_e5m2"
    raise UsageError(
        f"invalid value '{dtype.name}' for '--kv-cache-dtype <KV_CACHE_DTYPE>' (TGI) [possible values: {', '.join(KV_CACHE_DTYPES)}]"
    )


def check_fp8(attention: Attention, kv_flag: str | None, vendor: str) -> None:
    """`KVCache.__init__`'s rules for fp8 caches."""
    if kv_flag is None:
        return
    if not (attention.backend == "flashinfer" and vendor != "amd") and attention.backend != "paged":
        raise UsageError(
            "TGI refuses this: FP8 KV cache is currently only supported for flashinfer on CUDA and paged attention on CUDA, ROCm and INTEL IPEX and flashdecoding in Intel IPEX"
        )
    if vendor == "amd" and kv_flag == "fp8_e5m2":
        raise UsageError(
            "TGI refuses this: float8_e5m2 FP8 KV cache is not supported on AMD ROCm; use --kv-dtype fp8_e4m3"
        )


def kv_heads_per_shard(spec: ModelSpec, shards: int) -> int:
    """`FlashCausalLM`: num_key_value_heads // shards when > 1 (must divide, flash_llama_modeling's check)."""
    heads = spec.num_attention_heads if spec.is_mla else spec.num_kv_heads
    if spec.num_attention_heads % shards:
        raise UsageError(
            f"TGI refuses --num-shard {shards}: `num_heads` must be divisible by `num_shards` (got `num_heads`: {spec.num_attention_heads} and `num_shards`: {shards}"
        )
    if heads > 1 and heads % shards:
        raise UsageError(
            f"TGI refuses --num-shard {shards}: `num_key_value_heads` must be divisible by `num_shards` (got `num_key_value_heads`: {heads} and `num_shards`: {shards}"
        )
    return heads // shards if heads > 1 else heads


def head_size(spec: ModelSpec) -> int:
    """DeepSeek V2/V3 in TGI cache full K/V heads (no latent) of max(qk_nope + qk_rope, v_head_dim)."""
    latent = next((layer for layer in spec.layers if layer.kind == "mla"), None)
    if latent is not None:
        return max(latent.qk_nope_head_dim + latent.qk_rope_head_dim, latent.v_head_dim)
    return spec.head_dim


def kv_bytes_per_token(spec: ModelSpec, dtype: KvDtype, shards: int) -> int:
    """Per shard: every layer caches the whole context (no window), 2 x layers x heads x head_size x dtype size."""
    size = 1 if dtype.bits == 8 else dtype.bits // 8
    return 2 * spec.num_layers * kv_heads_per_shard(spec, shards) * head_size(spec) * size


def reservation_tokens(input_tokens: int, max_new_tokens: int, speculate: int = 0) -> int:
    """Tokens the queue reserves for one request before it runs."""
    return input_tokens + min(max_new_tokens, DEFAULT_GENERATION_LENGTH) + speculate - 1


@dataclass(frozen=True)
class TgiPool:
    """The KV pool TGI sizes at warmup: whole blocks, block 0 kept back."""

    num_blocks: int
    block_size: int

    @property
    def max_batch_total_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def usable_blocks(self) -> int:
        return max(0, self.num_blocks - 1)  # block 0 answers health checks

    def requests_fitting(self, reservation: int) -> int:
        """Requests whose up-front reservations fit in the pool at once."""
        return self.usable_blocks // -(-reservation // self.block_size)


def pool(kv_budget: int, bytes_per_token: int, block_size: int) -> TgiPool:
    return TgiPool(max(0, kv_budget) // (bytes_per_token * block_size), block_size)


# --- the memory terms -----------------------------------------------------------------------------------

CALIBRATE_HINT = common.CALIBRATE_HINT.replace("--vllm-log", "--tgi-log")


def memory_terms(inputs: PlanInputs, prefill: int) -> tuple[list[Term], int]:
    """Every term of the per-shard budget after warmup, and the KV bytes it leaves."""
    spec, tp, profile = inputs.spec, inputs.tp, inputs.profile
    if profile and profile.engine != "tgi":
        raise UsageError(
            f"--profile is a {profile.engine} profile; plan --engine {profile.engine} with it, or calibrate a TGI run"
        )
    fraction = inputs.memory_fraction or DEFAULT_CUDA_MEMORY_FRACTION
    total = common.device_total_term(inputs)
    budget = floor(total.bytes * fraction * TGI_WIGGLE_ROOM)
    serving = None if inputs.dtype == "auto" else inputs.dtype
    options = common.WeightOptions(Parallel(tp, 1, tp), serving_dtype=serving)  # TGI splits experts by tp
    weights = common.weight_bytes(spec, common.weight_format(spec, inputs.quantization), tp, options)
    terms = [
        total,
        Term(
            "budget",
            budget,
            "computed",
            f"total x cuda_memory_fraction {fraction:g} x TGI_WIGGLE_ROOM {TGI_WIGGLE_ROOM:g} (get_cuda_free_memory)",
        ),
        weights,
    ]
    if profile and profile.overhead_bytes is not None:
        terms.append(
            Term(
                "overhead", profile.overhead_bytes, "measured", f"profile {profile.source}: budget - weights - KV pool"
            )
        )
    else:
        forward = common.forward_activation_peak(spec, prefill, tp)
        # the warmup batch asks for prefill logprobs: every prefill token's logits and their log_softmax, 16-bit
        logits = prefill * spec.vocab_size * (2 + 2)
        terms.append(
            Term(
                "activation",
                forward + logits,
                "estimate",
                f"warmup prefill of {prefill} tokens: forward {forward} B + prefill logits {logits} B (kept in PyTorch's cache when TGI measures free memory)",
                CALIBRATE_HINT,
            )
        )
        terms.append(
            Term(
                "non_torch",
                common.non_torch_estimate(tp),
                "estimate",
                "CUDA context, cuBLAS and NCCL buffers (TGI measures device-wide free memory)",
                CALIBRATE_HINT,
            )
        )
    kv = budget - sum(term.bytes for term in terms[2:])
    terms.append(
        Term(
            "kv_cache",
            kv,
            "computed",
            "budget - weights - activation - non-torch: TGI's KV pool, allocated whole at warmup",
        )
    )
    return terms, kv


def default_prefill(spec: ModelSpec) -> int:
    """The launcher's fallback when its FLOPs table does not apply (`main.rs`: gemma3 8000, qwen2-vl 10000)."""
    return {"gemma3": 8000, "gemma3_text": 8000, "qwen2_vl": 10000, "qwen2_5_vl": 10000}.get(
        spec.model_type, DEFAULT_MAX_BATCH_PREFILL_TOKENS
    )
