"""The TGI plan: the shard's budget after warmup (budget.py), the KV pool in blocks, what each request reserves,
the `text-generation-launcher` flags, and whether TGI would start and serve the workload."""

from __future__ import annotations

from dataclasses import replace
from math import ceil, floor
from typing import Any

from kvops.dtypes import resolve_kv_dtype
from kvops.engines import common
from kvops.engines.device_total import device_total
from kvops.engines.flags import flag_args, with_kept
from kvops.engines.tgi import budget, flags, options, releases
from kvops.engines.tgi import prefill as prefill_default
from kvops.engines.tgi.releases import TgiRelease
from kvops.errors import MissingDevice, UsageError
from kvops.frozen import frozen
from kvops.plan import Plan, PlanInputs, Verdict, model_argument
from kvops.units import format_bytes
from kvops.workload import Workload

NUM_BLOCKS_NOTE = "TGI's max batch total tokens = num_blocks x block size; block 0 is kept for health checks"
# CUDA graphs TGI captures after sizing its pool (batch sizes 1-32): public vLLM logs show 0.17 GiB (TP4,
# noonghunna/club-3090#127) to 0.5 GiB (TP2, club-3090#104) for theirs; no TGI log in the corpus states it.
CUDA_GRAPHS_ESTIMATE = 512 * (1 << 20)
LEGACY_PREFILL = 4096  # max-batch-prefill-tokens: the 0.9-1.x clap default, 2.4.1's cap


@frozen
class TgiCapacity:
    """The plan's KV pool as TGI sizes it at warmup, and what the planned requests reserve in it."""

    num_blocks: int
    usable_blocks: int
    block_size: int
    kv_bytes_per_token: int
    max_batch_total_tokens: int  # the pool in tokens: 'Setting max batch total tokens to N'
    max_model_len: int  # --max-total-tokens
    max_concurrency: float
    reservation_tokens_per_request: int
    blocks_per_request: int
    requests_under_warn: int
    requests_at_full: int
    warn_level: float
    max_batch_prefill_tokens: int
    attention: str
    prefill_chunking: bool

    @property
    def kv_tokens(self) -> int:
        return self.max_batch_total_tokens

    @property
    def request_tokens(self) -> int:
        return self.reservation_tokens_per_request

    @property
    def holding(self) -> str:
        return f"each holding {self.reservation_tokens_per_request:,} KV tokens"  # the full context, windows or not

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "usable_blocks": self.usable_blocks,
            "block_size": self.block_size,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_batch_total_tokens": self.max_batch_total_tokens,
            "kv_tokens": self.max_batch_total_tokens,
            "num_blocks_note": NUM_BLOCKS_NOTE,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
            "reservation_tokens_per_request": self.reservation_tokens_per_request,
            "blocks_per_request": self.blocks_per_request,
            "requests_under_warn": self.requests_under_warn,
            "requests_at_full": self.requests_at_full,
            "warn_level": self.warn_level,
            "max_batch_prefill_tokens": self.max_batch_prefill_tokens,
            "attention": self.attention,
            "prefill_chunking": self.prefill_chunking,
        }

    def lines(self) -> list[str]:
        warn = f"{self.warn_level:.0%}"
        return [
            f"KV pool          {self.max_batch_total_tokens:,} tokens ('Setting max batch total tokens to'), {self.num_blocks:,} blocks of {self.block_size}, {self.kv_bytes_per_token:,} B per token per shard",
            f"max concurrency  {self.max_concurrency:.2f}x at max-total-tokens {self.max_model_len:,}",
            f"workload         {self.reservation_tokens_per_request:,} tokens reserved per request: {self.requests_under_warn} requests under the warn level ({warn}), {self.requests_at_full} at 100%",
        ]


def plan_once(inputs: PlanInputs) -> Plan:
    """The TGI plan for these inputs, fitting or not (no ways out: the planner searches those)."""
    _refuse_other_engines_options(inputs)
    spec, tp, gpu = inputs.spec, inputs.tp, inputs.gpu
    if gpu is None:
        raise MissingDevice("missing --gpu NAME or --gpu-memory SIZE")
    if inputs.devices != tp:
        raise UsageError(
            f"TGI runs one replica per launcher over --num-shard GPUs: give --gpus {tp} (= --tp) and start {inputs.replicas} launchers"
        )
    release = releases.release(inputs.engine_version)
    dtype = resolve_kv_dtype(inputs.kv_dtype, spec.dtype)
    kv_flag = budget.tgi_kv_dtype(dtype, spec.dtype)
    speculate = inputs.speculative.tokens if inputs.speculative else 0
    attention = replace(budget.resolve_attention(spec, gpu.vendor, release, gpu.id), speculate=speculate)
    budget.check_fp8(attention, kv_flag, gpu.vendor)
    per_token = budget.kv_bytes_per_token(spec, dtype, tp)
    model_limit = common.model_limit(spec, inputs.max_model_len)
    chunks, chunk_reason = budget.chunking(spec, attention, release)
    _check_limits(inputs, chunks)
    prefill, prefill_note, emit_prefill = _prefill(inputs, release, chunks, model_limit)
    memory, kv_bytes = budget.memory_terms(inputs, release, prefill)
    pool = budget.pool(kv_bytes, per_token, attention.block_size, release)
    notes = [
        f"engine release: {release.label}, {release.how}",
        f"attention {attention.backend} (block size {attention.block_size}): {attention.reason}; {chunk_reason}",
    ]
    if prefill_note:
        notes.append(prefill_note)
    if speculate:
        notes.append(
            f"--speculate {speculate}: each request reserves {speculate} more tokens (backends/v3/src/queue.rs)"
        )
    notes.append(common.paging_note(pool.num_blocks, attention.block_size, kv_bytes))
    sequences = inputs.workload.sequences
    target = inputs.concurrency if isinstance(inputs.concurrency, int) else 1
    length = _max_total_tokens(inputs, release, pool, model_limit, target * sequences, notes)
    max_input = inputs.max_input_tokens if inputs.max_input_tokens is not None else max(1, length - 1)
    if not chunks and inputs.max_input_tokens is None and max_input > prefill:
        max_input = prefill
        notes.append(
            f"prefill chunking is off: max-input-tokens held to --max-batch-prefill-tokens ({prefill}), the longest "
            f"prompt TGI takes in one prefill; max-total-tokens stays {length}: generated tokens need no prefill "
            "(raise --max-batch-prefill-tokens for longer prompts: it costs warmup memory)"
        )
    reservation = _reservation(inputs.workload, length, release, speculate)
    blocks_per_request = sequences * -(-reservation // attention.block_size)
    under_warn = floor(inputs.warn_level * pool.usable_blocks / blocks_per_request) if blocks_per_request else 0
    at_full = pool.usable_blocks // blocks_per_request if blocks_per_request else 0
    capacity = TgiCapacity(
        num_blocks=pool.num_blocks,
        usable_blocks=pool.usable_blocks,
        block_size=attention.block_size,
        kv_bytes_per_token=per_token,
        max_batch_total_tokens=pool.max_batch_total_tokens,
        max_model_len=length,
        max_concurrency=round(pool.usable_blocks / -(-length // attention.block_size), 4) if length else 0,
        reservation_tokens_per_request=reservation,
        blocks_per_request=blocks_per_request,
        requests_under_warn=under_warn,
        requests_at_full=at_full,
        warn_level=inputs.warn_level,
        max_batch_prefill_tokens=prefill,
        attention=attention.backend,
        prefill_chunking=chunks,
    )
    concurrent = _max_concurrent_requests(inputs, at_full, target, notes)
    engine_flags: dict[str, Any] = {
        "model-id": model_argument(spec),
        "num-shard": tp,
        "max-input-tokens": max_input,
        "max-total-tokens": length,
        "max-batch-prefill-tokens": prefill if emit_prefill else None,
        "max-concurrent-requests": concurrent,
        "cuda-memory-fraction": inputs.memory_fraction or budget.DEFAULT_CUDA_MEMORY_FRACTION,
        # 0.9.0-0.9.3 allocate this, not what fits: the plan's pool, or their 16000 default would be taken
        "max-batch-total-tokens": None if release.sizes_pool else pool.max_batch_total_tokens,
    }
    engine_flags = {name: value for name, value in engine_flags.items() if value is not None}
    launcher = options.for_version(release.version)
    if inputs.memory_fraction is None and not launcher.has("--cuda-memory-fraction"):
        del engine_flags["cuda-memory-fraction"]  # before the option, TGI took the whole device (its default 1.0)
    if kv_flag:
        engine_flags["kv-cache-dtype"] = kv_flag
    engine_flags |= _model_flags(inputs, speculate)
    if "quantize" in engine_flags:
        options.check_quantize(launcher, engine_flags["quantize"], release.label)
    engine_flags = options.spelled(launcher, engine_flags, release.label)
    warnings = _warnings(inputs, release, notes, length)
    if inputs.profile:
        warnings += common.profile_mismatch(inputs, str(release.version), release.label)
    return Plan(
        inputs=inputs,
        memory=tuple(memory),
        kv_cache_bytes=kv_bytes,
        capacity=capacity,
        flags=engine_flags,
        program=inputs.launcher or flags.PROGRAM,
        args=tuple(with_kept(flag_args(engine_flags), engine_flags, inputs.kept_options)),
        image=options.image(release.version, gpu.vendor),
        port=inputs.port or flags.PORT,
        verdict=_verdict(inputs, release, memory, kv_bytes, pool, capacity, max_input, attention),
        warnings=tuple(warnings),
        notes=tuple(notes),
        release=release,
    )


def _max_concurrent_requests(inputs: PlanInputs, at_full: int, target: int, notes: list[str]) -> int | None:
    """The router's in-flight limit: what the stated requests fit at once (those beyond get TGI's 429 "Model is
    overloaded" instead of waiting); None, TGI's own default, when no workload is stated. Sized for requests that
    fill the context it would refuse short requests the pool could run, where stock TGI queues them."""
    if inputs.max_num_seqs is not None:
        return inputs.max_num_seqs
    sized = max(1, at_full, target) * inputs.workload.sequences
    if (
        inputs.workload.total_tokens is None
        and inputs.concurrency is None
        and sized < budget.DEFAULT_MAX_CONCURRENT_REQUESTS
    ):
        notes.append(
            f"max-concurrent-requests: TGI's default ({budget.DEFAULT_MAX_CONCURRENT_REQUESTS}): no workload stated; "
            f"at the whole context {sized} requests fit at once (--prompt-tokens/--gen-tokens size it)"
        )
        return None
    return sized


# kvops's weight formats -> TGI's --quantize values (launcher/src/main.rs `enum Quantization`)
QUANTIZE_FLAGS = {
    "awq": "awq",
    "gptq": "gptq",
    "fp8": "fp8",
    "eetq": "eetq",
    "int8": "eetq",
    "bitsandbytes": "bitsandbytes",
    "bitsandbytes-nf4": "bitsandbytes-nf4",
    "bitsandbytes-fp4": "bitsandbytes-fp4",
    "compressed-tensors": "compressed-tensors",
}
_DTYPE_FLAGS = {"fp16": "float16", "bf16": "bfloat16"}


def _model_flags(inputs: PlanInputs, speculate: int) -> dict[str, Any]:
    """--revision, --quantize (an explicit format), --dtype and --speculate as the launcher spells them."""
    model_flags: dict[str, Any] = {}
    if inputs.spec.revision:
        model_flags["revision"] = inputs.spec.revision
    if inputs.quantization != "auto":
        name = inputs.quantization.lower()
        if name not in QUANTIZE_FLAGS and name not in ("bf16", "fp16"):
            raise UsageError(
                f"--quantization {name}: TGI 3.3.7 --quantize takes {', '.join(sorted(set(QUANTIZE_FLAGS.values())))}"
            )
        if name in QUANTIZE_FLAGS:
            model_flags["quantize"] = QUANTIZE_FLAGS[name]
    if inputs.dtype != "auto":
        if inputs.dtype not in _DTYPE_FLAGS:
            raise UsageError(f"--dtype {inputs.dtype}: TGI takes --dtype float16 or bfloat16")
        model_flags["dtype"] = _DTYPE_FLAGS[inputs.dtype]
    if speculate:
        model_flags["speculate"] = speculate
    return model_flags


def _refuse_other_engines_options(inputs: PlanInputs) -> None:
    if inputs.device != "gpu":
        raise UsageError("--device cpu is for vLLM's CPU build; TGI plans are for GPUs")
    if inputs.pp > 1:
        raise UsageError("--pp: TGI has no pipeline parallelism (--num-shard is tensor parallelism); give --tp")
    speculative = inputs.speculative
    if speculative and speculative.method not in ("speculate", "ngram", "medusa"):
        raise UsageError(
            f"--speculative-config method {speculative.method} is vLLM's; TGI speculates with --speculate N (n-gram, or the checkpoint's Medusa heads)"
        )
    for name, changed in (
        ("--enable-expert-parallel", inputs.expert_parallel),
        ("--language-model-only", inputs.text_only),
        ("--cpu-offload-gb", inputs.cpu_offload_bytes),
        ("--disable-hybrid-kv-cache-manager", not inputs.hybrid_manager),
        ("--mamba-cache-mode", inputs.mamba_cache_mode),
        ("--enable-lora", inputs.lora),
        ("--decode-context-parallel-size", inputs.dcp > 1),
        ("--compilation-config", inputs.compilation_config),
        ("--disable-sliding-window", inputs.disable_sliding_window),
    ):
        if changed:
            raise UsageError(f"{name} is a vLLM option; TGI has no such setting")
    for name, value in (
        ("--kv-cache-memory-bytes", inputs.kv_cache_memory_bytes),
        ("--block-size", inputs.block_size),
        ("--num-gpu-blocks-override", inputs.num_gpu_blocks_override),
        ("--max-queued", inputs.max_queued),
    ):
        if value is not None:
            raise UsageError(f"{name} is a vLLM option; TGI sizes its KV pool itself (use --cuda-memory-fraction)")
    if inputs.enforce_eager:
        raise UsageError("--enforce-eager is a vLLM option; TGI runs without CUDA graphs with --cuda-graphs 0")
    if inputs.guard:
        raise UsageError("--guard adds vLLM's KV-guard scheduler; TGI has no scheduler plugin (use the kvops proxy)")


def _check_limits(inputs: PlanInputs, chunks: bool) -> None:
    """Limits the user gave that TGI refuses whatever the memory: a usage error in TGI's words, not a plan."""
    max_input, length, prefill = inputs.max_input_tokens, inputs.max_model_len, inputs.batched_tokens
    if max_input is not None and isinstance(length, int) and max_input >= length:
        raise UsageError(
            f"--max-input-tokens {max_input} must be below --max-model-len (TGI --max-total-tokens) {length}: TGI refuses "
            f"'Invalid argument: `max_input_tokens`({max_input}) must be < `max_total_tokens`({length})'"
        )
    needed = max_input if max_input is not None else (length - 1 if isinstance(length, int) else None)
    if not chunks and prefill is not None and needed is not None and prefill < needed:
        raise UsageError(
            f"--max-batch-prefill-tokens {prefill} is below the {needed} input tokens TGI must take in one prefill "
            f"(no prefill chunking for this model): TGI refuses '`max_batch_prefill_tokens` must be >= `max_input_tokens`. "
            f"Given: {prefill} and {needed}'; give --max-batch-prefill-tokens {needed} or more"
        )


def _prefill(inputs: PlanInputs, release: TgiRelease, chunks: bool, model_limit: int) -> tuple[int, str, bool]:
    """The warmup prefill, why, and whether the plan emits it: given, else the release's launcher default; without
    chunking a whole prompt must fit. From 3.0 the launcher computes its default from the GPU it finds (prefill.py):
    with prefill chunking the plan takes that value and leaves the flag out, so TGI picks it itself (the same value
    on the planned GPU, its own choice on any other); without chunking it emits it, since the max-input-tokens it
    emits must fit in it, raised where a given prompt length needs more."""
    if inputs.batched_tokens:
        return inputs.batched_tokens, "", True
    given = inputs.max_input_tokens or (inputs.max_model_len - 1 if isinstance(inputs.max_model_len, int) else None)
    if release.version.at_least(3, 0):
        given = given or (None if chunks else inputs.workload.prompt_tokens)  # a stated prompt, in one prefill
        fraction = inputs.memory_fraction or budget.DEFAULT_CUDA_MEMORY_FRACTION
        found = prefill_default.default(
            inputs.spec.config_json, inputs.gpu, inputs.tp, fraction, release.version, inputs.quantization
        )
        if chunks:
            return found.tokens, f"max-batch-prefill-tokens {found.tokens:,}, not emitted: {found.why}", False
        if found.tokens >= (given or 0):
            pinned = "without prefill chunking the emitted max-input-tokens must fit in it (the router refuses less)"
            return found.tokens, f"max-batch-prefill-tokens {found.tokens:,}, emitted: {found.why}; {pinned}", True
        raised = (
            f"to the {given:,} input tokens TGI must take in one prefill without chunking (the router refuses less)"
        )
        return given or 0, f"max-batch-prefill-tokens {given:,}: raised from {found.why}, {raised}", True
    max_input = given if given is not None else _legacy_max_total(release, model_limit) - 1
    if release.version.at_least(2, 4, 1):  # launcher main.rs: 4096.min(max_position_embeddings, itself <= 4096)
        default = min(LEGACY_PREFILL, inputs.spec.max_position_embeddings or LEGACY_PREFILL)
        return max(default, max_input), "", True  # without chunking the router refuses less than max_input
    if release.version.at_least(2, 0):
        return max_input + 50, "", True  # launcher main.rs: "Adding some edge ... for block_size alignment"
    return max(LEGACY_PREFILL, max_input), "", True  # the 1.x launcher's clap default, which must hold one prompt


def _legacy_max_total(release: TgiRelease, model_limit: int) -> int:
    """max_total_tokens before 3.x, when not given: 2048 (clap default, 0.9-1.x); min(max_position_embeddings,
    4096) in 2.x ("Model supports up to N but tgi will now set its default to 4096")."""
    return min(model_limit, 4096) if release.version.at_least(2, 0) else 2048


def _max_total_tokens(
    inputs: PlanInputs, release: TgiRelease, pool: budget.TgiPool, model_limit: int, sequences: int, notes: list[str]
) -> int:
    if inputs.max_model_len == "auto":
        target = inputs.concurrency if isinstance(inputs.concurrency, int) else 1
        notes.append(
            f"--max-model-len auto: the longest max-total-tokens at which {target} request(s) stay under the warn level ({inputs.warn_level:.0%} of {pool.usable_blocks} usable blocks)"
        )
        blocks = floor(inputs.warn_level * pool.usable_blocks / sequences)
        return min(model_limit, blocks * pool.block_size + 1) if blocks else 0
    if isinstance(inputs.max_model_len, int):
        return inputs.max_model_len
    if not release.version.at_least(3, 0):
        return _legacy_max_total(release, model_limit)
    return min(model_limit, pool.max_batch_total_tokens) if pool.max_batch_total_tokens > 1 else model_limit


def _reservation(workload: Workload, length: int, release: TgiRelease, speculate: int = 0) -> int:
    if workload.total_tokens is None:  # the worst request: max input plus one new token, or short input plus many
        return max(1, length - 1 + speculate)
    return max(1, budget.reservation_tokens(workload.prompt_tokens or 0, workload.gen_tokens or 0, release, speculate))


ROPE_OPTIONS = ("--rope-scaling", "--rope-factor")
ROPE_ENVIRONMENT = ("ROPE_SCALING", "ROPE_FACTOR")  # the same options from the environment (clap `env`)


def _beyond_positions(inputs: PlanInputs, positions: int, length: int) -> str:
    """The warning for a context past the model's trained positions, worded on the rope scaling the pasted line
    gives: TGI takes --rope-scaling alone at factor 1.0 and --rope-factor alone as linear scaling (the `rope`
    match in launcher/src/main.rs), so the positions reached are max_position_embeddings x the factor."""
    head = (
        f"--max-total-tokens {length} exceeds {inputs.spec.name}'s max_position_embeddings {positions}: TGI takes "
        "it, but the model was not trained for longer sequences"
    )
    given = {option: value for option in ROPE_OPTIONS if (value := _kept_value(inputs, option)) is not None}
    needed = ceil(10 * length / positions) / 10
    if not given:
        environment = [
            name for name in ROPE_ENVIRONMENT if any(line.startswith(f"{name}:") for line in inputs.command_lines)
        ]
        if environment:
            return f"{head}; the line's environment sets {' and '.join(environment)} (their values not read): check they stretch it {needed}x"
        return f"{head} (extend it with --rope-scaling and --rope-factor {needed}, or plan a shorter context)"
    stated = " ".join(f"{option} {value}" for option, value in given.items())
    try:
        factor = float(given.get("--rope-factor", "1.0"))
    except ValueError:
        return f"{head}; the line's {stated}: --rope-factor is not a number TGI takes"
    how = "" if "--rope-scaling" in given else " (linear: TGI's scaling without --rope-scaling)"
    if "--rope-factor" not in given:
        how = " (TGI takes the factor as 1.0 without --rope-factor)"
    reach = floor(positions * factor)
    stretch = "stretch" if len(given) > 1 else "stretches"
    if reach >= length:
        return f"{head}; the line's {stated} {stretch} it to {reach:,} positions{how}: check the quality at that length"
    return f"{head}; the line's {stated} {stretch} it to {reach:,} positions only{how}: give --rope-factor {needed}, or plan a shorter context"


def _kept_value(inputs: PlanInputs, option: str) -> str | None:
    """The value a pasted command gave an option kept as given (--opt value, or --opt=value), None without it."""
    for canonical, *words in inputs.kept_options:
        if canonical == option and words:
            return words[0].partition("=")[2] if "=" in words[0] else (words[1] if len(words) > 1 else "")
    return None


def _warnings(inputs: PlanInputs, release: releases.TgiRelease, notes: list[str], length: int) -> list[str]:
    spec = inputs.spec
    warnings = []
    if spec.max_position_embeddings and length > spec.max_position_embeddings:
        warnings.append(_beyond_positions(inputs, spec.max_position_embeddings, length))
    if spec.sliding_window:
        notes.append(
            f"{spec.name} has sliding-window layers (window {spec.sliding_window}): TGI still reserves and caches the full context for every request (Model.info window_size None)"
        )
    if inputs.workload.sequences > 1:
        notes.append(
            f"{inputs.workload.sequences} sequences per request: TGI's best_of runs each as an independent request with its own full reservation and concurrency permit"
        )
    generated = (
        f"min(max_new_tokens, {budget.DEFAULT_GENERATION_LENGTH})"
        if release.version.at_least(3, 1, 1)
        else "max_new_tokens"
    )
    notes.append(
        f"each request reserves input + {generated} tokens up front; TGI never preempts, requests wait in the queue"
    )
    notes.append(_pool_flag_note(release))
    fraction = inputs.memory_fraction or 1.0
    total = device_total(inputs)
    spare = floor(total * fraction) - floor(total * fraction * release.wiggle_room)
    graphs = CUDA_GRAPHS_ESTIMATE
    launcher = options.for_version(release.version)
    if graphs > spare and launcher.has("--cuda-graphs"):
        warnings.append(
            f"CUDA graphs (~{format_bytes(graphs)}, captured after the KV pool) may not fit in the {format_bytes(spare)} TGI_WIGGLE_ROOM leaves: consider --cuda-graphs 0"
        )
    return warnings


def _pool_flag_note(release: releases.TgiRelease) -> str:
    if release.sizes_pool:
        return f'--max-batch-total-tokens is not emitted: TGI ignores it on flash models ("{flags.MAX_BATCH_TOTAL_TOKENS_IGNORED}") and sizes the pool from free memory'
    return (
        f"--max-batch-total-tokens is the KV pool the plan sizes: {release.label} does not size one, it allocates the "
        "flag's value (default 16000) as ceil(N / 16) + 10 blocks before its warmup prefill and fails the warmup "
        "('Not enough memory to handle N total tokens with P prefill tokens') when they do not fit"
    )


def _verdict(
    inputs: PlanInputs,
    release: TgiRelease,
    memory: list,
    kv_bytes: int,
    pool: budget.TgiPool,
    capacity: TgiCapacity,
    max_input: int,
    attention: budget.Attention,
) -> Verdict | None:
    block_bytes = capacity.kv_bytes_per_token * attention.block_size
    length, prefill = capacity.max_model_len, capacity.max_batch_prefill_tokens
    terms = {term.name: term.bytes for term in memory}
    if kv_bytes <= 0 or length == 0:
        others = sum(terms.get(name, 0) for name in ("weights", "activation", "non_torch", "overhead"))
        return Verdict(
            f"{common.what_does_not_fit(terms, terms['budget'])} need {format_bytes(others)} per shard but TGI may use {format_bytes(terms['budget'])}; nothing is left for the KV cache",
            others + block_bytes * 2,
            terms["budget"],
            states_need=True,
        )
    errors = flags.validation_errors(
        max_input, length, prefill, pool.max_batch_total_tokens, attention.supports_chunking
    )
    if errors:
        need = -(-length // attention.block_size) * block_bytes
        return Verdict(
            f"TGI would refuse to start: {errors[0]} (the KV pool holds {pool.max_batch_total_tokens} tokens = {format_bytes(kv_bytes)})",
            max(need, prefill * capacity.kv_bytes_per_token),
            kv_bytes,
        )
    refused = _refused_requests(inputs, release, capacity, max_input)
    if refused:
        asked = inputs.workload.total_tokens or length
        return Verdict(refused, -(-asked // attention.block_size) * block_bytes, kv_bytes, states_need=True)
    under_warn, per_request, reservation = (
        capacity.requests_under_warn,
        capacity.blocks_per_request,
        capacity.reservation_tokens_per_request,
    )
    if isinstance(inputs.concurrency, int) and inputs.concurrency > under_warn:
        need = (ceil(inputs.concurrency * per_request / inputs.warn_level) + 1) * block_bytes
        return Verdict(
            f"{inputs.concurrency} concurrent requests reserving {reservation} tokens each need {format_bytes(need)} of KV cache with the {inputs.warn_level:.0%} warn level; the plan has {format_bytes(kv_bytes)} ({under_warn} under the warn level)",
            need,
            kv_bytes,
            states_need=True,
        )
    if inputs.concurrency == "auto" and under_warn < 1:
        return Verdict(
            f"not one request reserving {reservation} tokens stays under the warn level",
            ceil(per_request / inputs.warn_level + 1) * block_bytes,
            kv_bytes,
        )
    return None


def _refused_requests(inputs: PlanInputs, release: TgiRelease, capacity: TgiCapacity, max_input: int) -> str | None:
    """Why TGI's router refuses every request of the stated size (router/src/validation.rs `validate_input`, its
    checks in its order), or None."""
    prompt, gen = inputs.workload.prompt_tokens, inputs.workload.gen_tokens
    if prompt is None or gen is None:
        return None
    generated = budget.generation_round(gen, release)
    length = capacity.max_model_len
    if prompt + generated > length:
        return (
            f"requests of {prompt} prompt + {gen} generated tokens exceed --max-total-tokens {length}: TGI refuses "
            f"every one ('`inputs` tokens + `max_new_tokens` must be <= {length}. Given: {prompt} `inputs` tokens and "
            f"{generated} `max_new_tokens`'); raise --max-model-len or state shorter requests"
        )
    if prompt > max_input:
        return (
            f"requests of {prompt} prompt tokens exceed --max-input-tokens {max_input}: TGI refuses every one "
            f"('`inputs` must have less than {max_input} tokens. Given: {prompt}'); raise --max-input-tokens"
            f"{'' if capacity.prefill_chunking else ' and --max-batch-prefill-tokens'} or state shorter prompts"
        )
    return None


# --- the ways out this engine offers --------------------------------------------------------------------


def kv_dtype_ways(inputs: PlanInputs) -> list[str]:
    """TGI's --kv-cache-dtype takes fp8 only."""
    return ["fp8"]


def kv_dtype_spelling(inputs: PlanInputs, name: str) -> str:
    """How TGI is told to keep the KV cache in `name` (it takes fp8 only)."""
    value = budget.tgi_kv_dtype(resolve_kv_dtype(name, inputs.spec.dtype), inputs.spec.dtype)
    return f"{name} KV, TGI --kv-cache-dtype {value}"
