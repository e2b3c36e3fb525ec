"""TGI 3.x (text-generation-inference v3.3.7): how the shards size the KV pool, and what a request reserves.

From the source (huggingface/text-generation-inference @ db931fcf, one commit after v3.3.7):
- `launcher/src/main.rs::resolve_attention`: flashinfer (block size 1) when config.json's head dim (top level, or
  hidden_size / heads; text_config.head_dim from 3.2.1) is 64, 128 or 256 and the model is not falcon/deepseek_v2;
  otherwise flashdecoding (block 256) on compute capability >= 8, paged (block 16) below; `Dockerfile_amd` sets
  ATTENTION=paged on ROCm. `models/globals.py::BLOCK_SIZE`.
- `FlashCausalLM.warmup`: after loading the weights and running a worst-case prefill of
  `max_batch_prefill_tokens` tokens, `free = mem_get_info free - (1 - CUDA_MEMORY_FRACTION x TGI_WIGGLE_ROOM)
  x total` (`get_cuda_free_memory`, TGI_WIGGLE_ROOM 0.90); `num_blocks = free // (layers x BLOCK_SIZE x kv_heads
  x head_size x 2 x dtype_size)` (+ the warmup batch's own blocks, already counted as used); the router sets
  max batch total tokens to `num_blocks x BLOCK_SIZE`. The whole pool is allocated at startup.
- KV heads per shard `num_key_value_heads // num_shard` (must divide, one head too: only gpt_bigcode and Falcon's
  multi-query attention keep it whole on every shard); no sliding-window saving:
  `Model.info` returns window_size None, every request reserves its full length.
- `backends/v3/src/queue.rs`: a request reserves `input + max_new_tokens + speculate - 1` tokens up front, with
  max_new_tokens cut to `DEFAULT_GENERATION_LENGTH` = 1024 per round from 3.1.1 (`router/src/validation.rs`); no preemption,
  requests wait. Block 0 is kept for health checks (`block_allocator.rs`, `radix.rs`).
"""

from __future__ import annotations

from math import ceil, floor

from kvops.dtypes import KvDtype
from kvops.engines import common
from kvops.engines.device_total import device_total_term
from kvops.engines.overhead_fit import MIN_FAMILY_LOGS, OVERHEAD_QUANTILE
from kvops.engines.tgi.releases import TgiRelease
from kvops.engines.weights import WeightOptions, weight_bytes, weight_format
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.model.checkpoint import Parallel
from kvops.model.spec import ModelSpec, MultiLatentAttention
from kvops.overheads import POOLED, FamilyFit, shipped_fit
from kvops.plan import PlanInputs, Term

DEFAULT_CUDA_MEMORY_FRACTION = 1.0  # launcher --cuda-memory-fraction
DEFAULT_MAX_CONCURRENT_REQUESTS = 128  # launcher --max-concurrent-requests (launcher/src/main.rs)
DEFAULT_GENERATION_LENGTH = 1024  # router/src/validation.rs
BLOCK_SIZES = {"flashinfer": 1, "flashdecoding": 256, "paged": 16}
CHUNKING_ATTENTION = ("flashinfer", "flashdecoding")  # Model.__init__: prefill chunking only with these
KV_CACHE_DTYPES = ("fp8_e4m3fn", "fp8_e5m2")  # launcher enum KVCacheDtype
LEGACY_EXTRA_BLOCKS = 10  # the blocks 0.9.0-0.9.3 allocate beyond --max-batch-total-tokens


@frozen
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
        return self.backend in CHUNKING_ATTENTION


# Catalog GPUs below compute capability 8 (torch.cuda.get_device_capability): from 2.3.1 the launcher's fallback
# attention there is paged, not flashdecoding (launcher/src/main.rs `resolve_attention`, `major < 8`).
PRE_AMPERE = {"T4": (7, 5)}


def launcher_head_dim(spec: ModelSpec, release: TgiRelease | None) -> int | None:
    """The head dim the launcher reads from config.json (`Config::get_head_dim`, launcher/src/main.rs): the top-level
    head_dim, else hidden_size (or n_embd) / num_attention_heads when it divides; from 3.2.1 text_config.head_dim;
    from 3.3.0 256 for gemma3. A VLM's nested text config is not read otherwise: kvops' own head dim may differ."""
    config = spec.config_json
    if config is None:  # no config.json at hand (a built-in shape): kvops' own head dim
        return None if spec.is_mla else spec.head_dim
    if config.get("head_dim"):
        return int(config["head_dim"])
    hidden, heads = config.get("hidden_size") or config.get("n_embd"), config.get("num_attention_heads")
    if hidden and heads and hidden % heads == 0:
        return int(hidden // heads)
    text = config.get("text_config")
    if (release is not None and not release.version.at_least(3, 2, 1)) or not isinstance(text, dict):
        return None
    if text.get("head_dim"):
        return int(text["head_dim"])
    at_least_3_3 = release is None or release.version.at_least(3, 3)
    return 256 if at_least_3_3 and config.get("model_type") == "gemma3" else None


def _forced(release: TgiRelease | None) -> tuple[str, ...]:
    """Model types the launcher sends to the fallback attention whatever their head dim: gemma2 too in 2.3.x."""
    if release is not None and not release.version.at_least(2, 4):
        return ("gemma2", "falcon", "deepseek_v2")
    return ("falcon", "deepseek_v2")


def resolve_attention(spec: ModelSpec, vendor: str, release: TgiRelease | None = None, gpu: str = "") -> Attention:
    """The launcher's `resolve_attention` (launcher/src/main.rs, 2.3+; 2.2.0 set FLASH_DECODING for gemma2)."""
    if release is not None and not release.attention_sets_block_size:
        if release.version.at_least(2, 2) and spec.model_type == "gemma2":
            return Attention("flashdecoding", False, f"{release.label} forces flash decoding for gemma2 (softcap)")
        return Attention("paged", False, f"{release.label} pages its KV cache in blocks of 16 (models/globals.py)")
    if vendor == "amd":
        return Attention("paged", False, "ROCm image (Dockerfile_amd) sets ATTENTION=paged, PREFIX_CACHING=0")
    old = release is not None and not release.version.at_least(2, 3, 1)  # 2.3.0: no compute capability check
    fallback = "paged" if gpu in PRE_AMPERE and not old else "flashdecoding"
    why = f" (compute capability {'.'.join(map(str, PRE_AMPERE[gpu]))} < 8)" if fallback == "paged" else ""
    head_dim = launcher_head_dim(spec, release)
    if spec.model_type in _forced(release) and head_dim in (64, 128, 256):
        return Attention(fallback, fallback != "paged", f"launcher forces {fallback} for {spec.model_type}{why}")
    if head_dim in (64, 128, 256):
        return Attention("flashinfer", True, f"config.json head dim {head_dim} is supported by flashinfer")
    return Attention(
        fallback,
        False,
        f"config.json head dim {'unknown' if head_dim is None else head_dim} is not 64/128/256: {fallback}{why}, no prefix caching",
    )


# Vision-language models TGI serves without prefill chunking (the config's top-level model, as TGI's get_model
# reads it): from 3.3 only these (server/.../models/__init__.py, `support_chunking=False`, PR #3188 "Chunked Prefill
# VLM"); in 3.0-3.2 every VlmCausalLM model (vlm_causal_lm.py `support_chunking=False`).
NO_CHUNKING_ARCHITECTURES = (
    "Gemma3ForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "MllamaForConditionalGeneration",
)


def chunking(spec: ModelSpec, attention: Attention, release: TgiRelease) -> tuple[bool, str]:
    """Whether TGI chunks prefills for this model (then a prompt may exceed --max-batch-prefill-tokens), and why."""
    if not release.version.at_least(3, 0):
        return False, f"{release.label} has no prefill chunking"
    if attention.speculate:
        return False, f"prefill chunking off: --speculate {attention.speculate} turns it off"
    if not attention.supports_chunking:
        return False, f"attention {attention.backend} has no prefill chunking"
    for architecture in spec.architectures:
        vlm = architecture.endswith("ForConditionalGeneration")
        if architecture in NO_CHUNKING_ARCHITECTURES or (vlm and not release.version.at_least(3, 3)):
            return False, f"TGI {release.version} serves {architecture} without prefill chunking"
    return True, "prefill chunking on"


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


# Models whose TGI attention keeps a single KV head whole on every shard (`FlashCausalLM` leaves a count of 1 unsplit
# for them): gpt_bigcode/santacoder (flash_santacoder_modeling.py) and Falcon's multi-query attention
# (flash_rw_modeling.py FlashRWAttention; the new decoder architecture refuses more shards than KV groups).
REPLICATED_KV_HEAD = ("gpt_bigcode", "santacoder", "falcon", "RefinedWebModel")


def kv_heads_per_shard(spec: ModelSpec, shards: int) -> int:
    """`FlashCausalLM`: num_key_value_heads // shards. The heads must divide by the shards (flash_llama_modeling's
    ValueError from v2.1.0; before, every release failed the same launch on `_load_gqa`'s shape assertion: 1 // 2 is
    0 heads); only the multi-query models above keep one head on every shard."""
    heads = spec.num_attention_heads if spec.is_mla else spec.num_kv_heads
    if spec.num_attention_heads % shards:
        raise UsageError(
            f"TGI refuses --num-shard {shards}: `num_heads` must be divisible by `num_shards` (got `num_heads`: {spec.num_attention_heads} and `num_shards`: {shards}"
        )
    if heads == 1 and _replicates_kv_head(spec):
        return 1
    if heads % shards:
        single = (
            f" (TGI splits KV heads over the shards and keeps one whole on each only for the multi-query models {', '.join(REPLICATED_KV_HEAD)})"
            if heads == 1
            else ""
        )
        valid = [str(n) for n in range(1, heads + 1) if heads % n == 0 and spec.num_attention_heads % n == 0]
        raise UsageError(
            f"TGI refuses --num-shard {shards}: `num_key_value_heads` must be divisible by `num_shards` (got `num_key_value_heads`: {heads} and `num_shards`: {shards}{single}; give --num-shard {' or '.join(valid)}"
        )
    return heads // shards


def _replicates_kv_head(spec: ModelSpec) -> bool:
    config = spec.config_json or {}
    return spec.model_type in REPLICATED_KV_HEAD and not config.get("new_decoder_architecture")


def head_size(spec: ModelSpec) -> int:
    """DeepSeek V2/V3 in TGI cache full K/V heads (no latent) of max(qk_nope + qk_rope, v_head_dim)."""
    latent = next((layer for layer in spec.layers if isinstance(layer, MultiLatentAttention)), None)
    if latent is not None:
        return max(latent.qk_nope_head_dim + latent.qk_rope_head_dim, latent.v_head_dim)
    return spec.head_dim


def kv_bytes_per_token(spec: ModelSpec, dtype: KvDtype, shards: int) -> int:
    """Per shard: every layer caches the whole context (no window), 2 x layers x heads x head_size x dtype size."""
    return 2 * spec.num_layers * kv_heads_per_shard(spec, shards) * head_size(spec) * dtype.bits // 8


def reservation_tokens(input_tokens: int, max_new_tokens: int, release: TgiRelease, speculate: int = 0) -> int:
    """Tokens the queue reserves for one request before it runs: its max_new_tokens, cut to 1024 a round from
    3.1.1 (router/src/validation.rs, PR #3016; 3.0.x cut only a request that gave none)."""
    return input_tokens + generation_round(max_new_tokens, release) + speculate - 1


def generation_round(max_new_tokens: int, release: TgiRelease) -> int:
    """The max_new_tokens the router validates and queues a request with."""
    return min(max_new_tokens, DEFAULT_GENERATION_LENGTH) if release.version.at_least(3, 1, 1) else max_new_tokens


@frozen
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


def pool(kv_budget: int, bytes_per_token: int, block_size: int, release: TgiRelease | None = None) -> TgiPool:
    """The whole blocks the KV budget holds; for 0.9.0-0.9.3, the --max-batch-total-tokens whose ceil(N / 16) + 10
    blocks ("Adds some wiggle room", flash_causal_lm.py warmup) fit in it."""
    blocks = max(0, kv_budget) // (bytes_per_token * block_size)
    if release is not None and not release.sizes_pool:
        blocks = max(0, blocks - LEGACY_EXTRA_BLOCKS)
    return TgiPool(blocks, block_size)


# --- the memory terms -----------------------------------------------------------------------------------

CALIBRATE_HINT = common.CALIBRATE_HINT.replace("--vllm-log", "--tgi-log")
NON_TORCH_WHY = (
    "tp 1: what an A10G's nvidia-smi showed besides the weights and the KV pool after a TGI 2.2.0 warmup; "
    "tp >= 2: 1 GiB (releases.NON_TORCH_PRIOR)"
)


def activation_model(inputs: PlanInputs, release: TgiRelease, prefill: int) -> tuple[int, str]:
    """kvops' physical model of the warmup prefill's peak, kept in PyTorch's cache when TGI reads the free memory:
    the forward pass, the logits of the prefill (warmup_logits) and, where the release attends over dense masks,
    those masks and scores (dense_image_attention)."""
    forward = common.forward_activation_peak(inputs.spec, prefill, inputs.tp) + unfused_mlp(
        inputs.spec, prefill, inputs.tp
    )
    logits, which = warmup_logits(inputs, release, prefill)
    dense, how = dense_image_attention(inputs, release, prefill)
    what = f"warmup prefill of {prefill} tokens: forward {forward} B + {which}" + (f" + {how}" if dense else "")
    return forward + logits + dense, what


# Dense models whose TGI MLP computes `self.act(gate_up_states[:, 0]) * gate_up_states[:, 1]` before the down
# projection (`flash_llama_modeling.py` LlamaMLP.forward from v1.0.0 to v3.3.7; the same line in
# flash_mistral_modeling, flash_qwen2_modeling and flash_gemma_modeling at v3.3.7).
UNFUSED_MLP_MODEL_TYPES = ("llama", "mistral", "qwen2", "gemma")


def unfused_mlp(spec: ModelSpec, tokens: int, tp: int) -> int:
    """What TGI's MLP holds beyond kvops' forward model: the activated gate is a tensor of its own while the product
    is written (gate+up, act(gate) and the product at once: 4 intermediate widths), where the model counts 3 (vLLM's
    fused SiluAndMul writes the product straight from gate+up)."""
    if spec.num_experts or spec.model_type not in UNFUSED_MLP_MODEL_TYPES:
        return 0
    return ceil(tokens * spec.intermediate_size / tp * 2)


def warmup_requests(inputs: PlanInputs, prefill: int) -> tuple[int, int]:
    """(requests, tokens of the longest) in the router's warmup batch: `max_batch_prefill_tokens` cut into prompts
    of at most --max-input-tokens (`backends/v3/src/client/grpc_client.rs`, `warmup`)."""
    longest = min(inputs.max_input_tokens, prefill) if inputs.max_input_tokens else prefill
    return -(-prefill // longest), longest


# Gemma 3 in TGI 3.2.x: a prefill that carries an image attends through PyTorch SDPA over dense [batch, 1, S, S]
# masks, a global and a sliding one (`flash_gemma3_modeling.py`, `get_attention_mask`, v3.2.0-v3.2.3); 3.3.0 hands
# the mask to flashinfer instead (#3167, "Support flashinfer for Gemma3 prefill"). The warmup's first request carries
# an image (`grpc_client.rs`, `warmup`: WARMUP_IMAGE_BASE64).
DENSE_MASK_ARCHITECTURES = ("Gemma3ForConditionalGeneration",)


def dense_image_attention(inputs: PlanInputs, release: TgiRelease, prefill: int) -> tuple[int, str]:
    """The dense attention of an image prefill at warmup, over the batch padded to its longest request: the two
    16-bit masks, and SDPA's scores and their softmax for the shard's heads (with a mask and grouped KV heads
    PyTorch's SDPA runs its math kernel, which holds the [batch, heads, S, S] scores)."""
    version = release.version
    dense = version.at_least(3, 2) and not version.at_least(3, 3)
    if not dense or not any(name in DENSE_MASK_ARCHITECTURES for name in inputs.spec.architectures):
        return 0, ""
    requests, longest = warmup_requests(inputs, prefill)
    square = requests * longest * longest * 2
    heads = inputs.spec.num_attention_heads // inputs.tp
    masks, scores = 2 * square, 2 * heads * square
    return masks + scores, (
        f"dense image attention over {requests} x {longest}^2 ({release.label}, Gemma 3 with an image: "
        f"2 masks {masks} B, SDPA scores and softmax for {heads} heads {scores} B)"
    )


def warmup_logits(inputs: PlanInputs, release: TgiRelease, prefill: int) -> tuple[int, str]:
    """The warmup prefill's logits at their peak. The router's warmup batch asks for prefill logprobs
    (`backends/v3/src/client/grpc_client.rs`, `warmup`). Before 3.0 they are computed over every prefill token: 16-bit
    logits and, before 2.4, their log-softmax as a copy (2.4 takes it in place: #2661, `flash_causal_lm.py`); with tp
    > 1 the LM head also holds the shard's own slice beside the gathered logits (`layers/tensor_parallel.py`,
    `TensorParallelHead`), and that head returns the gathered logits as a transposed view (`world_out.T`, from 1.0:
    `utils/layers.py` at v1.0.0), which the log-softmax over the vocabulary copies into a contiguous tensor first.
    From 3.0 the server drops prefill logprobs unless REQUEST_LOGPROBS=1 (#2797, `models/globals.py`): each warmup
    request's last token alone."""
    spec, tp = inputs.spec, inputs.tp
    per_logit = 2 + (2 / tp if tp > 1 else 0)
    if release.version.at_least(3, 0):
        requests, _ = warmup_requests(inputs, prefill)
        logits = ceil(requests * spec.vocab_size * per_logit)
        return logits, f"last-token logits of {requests} warmup request(s) {logits} B (no prefill logprobs from 3.0)"
    if not release.version.at_least(2, 4):
        per_logit += 2  # the log-softmax copy beside the logits
    if tp > 1:
        per_logit += 2  # the gathered logits are a transposed view: the log-softmax reads a contiguous copy
    logits = ceil(prefill * spec.vocab_size * per_logit)
    return logits, f"prefill logits {logits} B ({per_logit:g} B per logit: the warmup's prefill logprobs)"


def memory_terms(inputs: PlanInputs, release: TgiRelease, prefill: int) -> tuple[list[Term], int]:
    """Every term of the per-shard budget after warmup, and the KV bytes the release's formula leaves."""
    spec, tp, profile = inputs.spec, inputs.tp, inputs.profile
    if profile and profile.engine != "tgi":
        raise UsageError(
            f"--profile is a {profile.engine} profile; plan --engine {profile.engine} with it, or calibrate a TGI run"
        )
    fraction = inputs.memory_fraction or DEFAULT_CUDA_MEMORY_FRACTION
    total = device_total_term(inputs)
    wiggle = release.wiggle_room
    share = fraction * wiggle if release.version.at_least(3, 0) else fraction
    budget = floor(total.bytes * share)
    serving = None if inputs.dtype == "auto" else inputs.dtype
    options = WeightOptions(Parallel(tp, 1, tp), serving_dtype=serving)  # TGI splits experts by tp
    weights = weight_bytes(spec, weight_format(spec, inputs.quantization), tp, options)
    what = f"x TGI_WIGGLE_ROOM {wiggle:g} " if release.version.at_least(3, 0) else ""
    terms = [
        total,
        Term(
            "budget",
            budget,
            "computed",
            f"total x cuda_memory_fraction {fraction:g} {what}(get_free_memory, {release.label})",
        ),
        weights,
    ]
    measured = common.model_measurements(inputs)
    if measured and measured.overhead_bytes is not None:
        terms.append(
            Term(
                "overhead",
                measured.overhead_bytes,
                "measured",
                f"profile {measured.source}: budget - weights - KV pool",
            )
        )
    else:
        terms += _estimated_overheads(inputs, release, prefill)
    free = budget - sum(term.bytes for term in terms[2:])
    if release.version.at_least(3, 0):
        kv, formula = free, "budget - weights - activation - non-torch"
    else:
        kv = floor(wiggle * free) if free > 0 else free
        formula = (
            f"{wiggle:g} x (budget - weights - activation - non-torch)"
            if wiggle < 1
            else "budget - weights - activation - non-torch"
        )
    formula += (
        f" - margin: {release.label}'s KV pool, allocated whole at warmup"
        if any(t.name == "margin" for t in terms)
        else f": {release.label}'s KV pool, allocated whole at warmup"
    )
    fit = _fit(inputs, release)
    if any(term.is_estimate for term in terms) and not fit.bounded:
        formula += f"; {fit.unbounded()}"
    terms.append(Term("kv_cache", kv, "computed", formula, band=_band(inputs, release, terms, kv)))
    return terms, kv


def _fit(inputs: PlanInputs, release: TgiRelease) -> FamilyFit:
    return (inputs.overhead_fit or shipped_fit("tgi")).family(release.family)


def _estimated_overheads(inputs: PlanInputs, release: TgiRelease, prefill: int) -> list[Term]:
    fit = _fit(inputs, release)
    model, which = activation_model(inputs, release, prefill)
    logs = (
        f"{fit.logs} public {fit.family} startup logs"
        if fit.family != POOLED
        else f"{fit.logs} public TGI startup logs"
    )
    activation = fit.activation(model)
    non_torch = fit.non_torch_bytes(inputs.tp)
    terms = [
        Term(
            "activation",
            activation,
            "estimate",
            f"kvops' model ({which}) {'+' if fit.activation_excess >= 0 else '-'} {abs(fit.activation_excess)} B, the {'median' if fit.logs >= MIN_FAMILY_LOGS else 'largest'} excess of {logs} over that model",
            CALIBRATE_HINT,
        ),
        Term(
            "non_torch",
            non_torch,
            "estimate",
            f"CUDA context, cuBLAS and NCCL buffers (TGI reads device-wide free memory): the median of {logs} at "
            f"this tp, else kvops' prior ({NON_TORCH_WHY})",
            CALIBRATE_HINT,
        ),
    ]
    if not fit.bounded:
        return terms
    return [
        *terms,
        Term(
            "margin",
            fit.margin,
            "estimate",
            f"with it, {OVERHEAD_QUANTILE:.0%} of {logs} had at least the KV this plan leaves, each predicted "
            "without its own log (err toward less KV)",
            CALIBRATE_HINT,
        ),
    ]


def _band(inputs: PlanInputs, release: TgiRelease, terms: list[Term], kv: int) -> tuple[int, int] | None:
    fit = _fit(inputs, release)
    if not any(term.is_estimate for term in terms) or not fit.bounded:
        return None
    below, above = fit.band()
    return kv - below, kv + above


def overhead_from_pool(release: TgiRelease, total: int, fraction: float, weights: int, kv: int) -> int:
    """What a run's pool says the warmup took besides the weights (activation + non-torch): the release's formula
    solved for it."""
    if release.version.at_least(3, 0):
        return floor(total * fraction * release.wiggle_room) - weights - kv
    return floor(total * fraction) - weights - ceil(kv / release.wiggle_room)
