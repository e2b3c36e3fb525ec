"""The vLLM plan: the memory budget (budget.py), the KV cache layout and pool (layout.py), the batch the workload
needs, the `vllm serve` flags, and whether it fits."""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, floor
from typing import Any

from kvops.dtypes import KvDtype, resolve_kv_dtype, serving_dtype
from kvops.engines import common
from kvops.engines.vllm import budget, flags, layout, options, releases
from kvops.errors import UsageError
from kvops.model.checkpoint import pipeline_partition
from kvops.model.spec import ModelSpec
from kvops.plan import Plan, PlanInputs, Term, Verdict, WayOut, model_argument
from kvops.units import format_bytes
from kvops.workload import Workload


@dataclass(frozen=True)
class VllmCapacity:
    """The plan's KV pool as vLLM sizes it, and the planned workload in it."""

    num_blocks: int
    usable_blocks: int
    block_size: int
    bytes_per_block: int
    kv_cache_groups: int
    kv_cache_size_tokens: int  # vLLM's 'GPU KV cache size': max concurrency x max-model-len
    max_model_len: int
    blocks_per_request_at_max_model_len: int
    max_concurrency: float
    tokens_per_request: int
    blocks_per_request: int
    blocks_per_request_in_prefill: int  # while its prompt is computed: a sliding window holds the tokens in flight
    requests_under_warn: int
    requests_at_full: int
    warn_level: float
    max_num_batched_tokens: int
    max_in_flight_tokens: int
    replicas: int
    engine_auto_max_model_len: int = 0  # what vLLM's own --max-model-len auto would pick for this KV memory
    sampler_sequences: int = 0  # the sequences the profile run sizes the sampler's logits for
    cache_groups: tuple[tuple[str, int | None, int], ...] = ()  # each KV cache group: kind, window, block size

    @property
    def kv_tokens(self) -> int:
        return self.kv_cache_size_tokens

    @property
    def request_tokens(self) -> int:
        return self.tokens_per_request

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "usable_blocks": self.usable_blocks,
            "block_size": self.block_size,
            "bytes_per_block": self.bytes_per_block,
            "kv_cache_groups": self.kv_cache_groups,
            "kv_tokens": self.kv_cache_size_tokens,
            "kv_cache_size_tokens": self.kv_cache_size_tokens,
            "max_model_len": self.max_model_len,
            "blocks_per_request_at_max_model_len": self.blocks_per_request_at_max_model_len,
            "max_concurrency": self.max_concurrency,
            "tokens_per_request": self.tokens_per_request,
            "blocks_per_request": self.blocks_per_request,
            "blocks_per_request_in_prefill": self.blocks_per_request_in_prefill,
            "requests_under_warn": self.requests_under_warn,
            "requests_at_full": self.requests_at_full,
            "warn_level": self.warn_level,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_in_flight_tokens": self.max_in_flight_tokens,
            "replicas": self.replicas,
            "engine_auto_max_model_len": self.engine_auto_max_model_len,
            "sampler_sequences": self.sampler_sequences,
            "kv_cache_group_specs": [
                {"kind": kind, "window": window, "block_size": size} for kind, window, size in self.cache_groups
            ],
        }

    def lines(self) -> list[str]:
        warn = f"{self.warn_level:.0%}"
        blocks = f"{self.blocks_per_request} blocks"
        if self.blocks_per_request_in_prefill != self.blocks_per_request:
            blocks += f" ({self.blocks_per_request_in_prefill:,} while its prompt is computed, for one at a time)"
        return [
            f"blocks           {self.num_blocks:,} of {self.block_size} tokens ({self.usable_blocks:,} usable; block 0 is the null block), {format_bytes(self.bytes_per_block)} each",
            f"KV tokens        {self.kv_cache_size_tokens:,} (vLLM's 'KV cache size': max concurrency x max-model-len)",
            f"max concurrency  {self.max_concurrency:.2f}x at max-model-len {self.max_model_len:,} ({self.blocks_per_request_at_max_model_len} blocks per request)",
            f"workload         {self.tokens_per_request:,} tokens per request, {blocks}: {self.requests_under_warn} requests under the warn level ({warn}), {self.requests_at_full} at 100%",
            f"batching         max-num-batched-tokens {self.max_num_batched_tokens:,}, {self.max_in_flight_tokens:,} tokens in flight",
            f"engine auto      vLLM's --max-model-len auto would pick {self.engine_auto_max_model_len:,} for this KV memory",
        ]


@dataclass
class _Draft:
    """What the plan collects on its way: the memory, its notes and warnings."""

    inputs: PlanInputs
    memory: list[Term]
    kv_bytes: int
    warnings: list[str]
    notes: list[str]
    release: releases.VllmRelease

    @property
    def margin_bytes(self) -> int:
        """kvops' margin below the engine's predicted KV (the 'margin' term), 0 when none is planned."""
        return next((term.bytes for term in self.memory if term.name == "margin"), 0)

    def plan(self, capacity: VllmCapacity | None, engine_flags: dict[str, Any], verdict: Verdict | None) -> Plan:
        inputs = self.inputs
        program = inputs.launcher or flags.PROGRAM
        return Plan(
            inputs=inputs,
            memory=tuple(self.memory),
            kv_cache_bytes=self.kv_bytes,
            capacity=capacity,
            flags=engine_flags,
            program=program,
            args=tuple(flags.arguments(engine_flags, program) if engine_flags else ()),
            image=options.image(self.release.version, inputs.gpu.vendor if inputs.gpu else None),
            port=flags.PORT,
            verdict=verdict,
            warnings=tuple(self.warnings),
            notes=tuple(self.notes),
            release=self.release,
            kv_margin_bytes=self.margin_bytes if self.kv_bytes > 0 else 0,
        )


MAX_SEQS_PASSES = 4  # the profile's sampler runs the emitted max_num_seqs: re-plan until the two agree


def plan_once(inputs: PlanInputs) -> Plan:
    """The vLLM plan for these inputs, fitting or not (no ways out: the planner searches those). The profile's
    sampler is sized for the --max-num-seqs the plan emits, as vLLM's `_dummy_sampler_run` runs it: the plan is
    re-made with the sequences it chose until they agree."""
    if inputs.device not in budget.DEVICES:
        raise UsageError(f"--device {inputs.device!r}; valid: {', '.join(budget.DEVICES)}")
    release = releases.release(inputs.engine_version)
    sizing = budget.kv_sizing(inputs, release)
    release = replace(release, extensible=sizing.extensible)
    chosen: int | None = None
    for _ in range(MAX_SEQS_PASSES):
        plan = _plan_pass(inputs, release, sizing, chosen)
        seqs = plan.flags.get("max-num-seqs")
        if inputs.as_run or inputs.max_num_seqs is not None or not isinstance(seqs, int):
            return plan
        if plan.capacity is not None and plan.capacity.sampler_sequences == seqs:  # type: ignore[attr-defined]
            return plan
        chosen = seqs
    return _plan_pass(inputs, release, sizing, chosen, forced=True)


def _plan_pass(
    inputs: PlanInputs,
    release: releases.VllmRelease,
    sizing: budget.KvSizing,
    chosen_seqs: int | None,
    forced: bool = False,
) -> Plan:
    """One plan with the profile's sampler sized for `chosen_seqs` sequences (None: vLLM's default for the
    device); `forced` emits exactly them as --max-num-seqs (else the plan chooses again)."""
    spec, device, tp = inputs.spec, inputs.device, inputs.tp
    release_options = options.for_version(release.version)
    options.check_weight_format(release_options, common.weight_format(spec, inputs.quantization).name, release.label)
    served = spec.dtype if inputs.dtype == "auto" else serving_dtype(inputs.dtype)  # kv dtype auto follows --dtype
    dtype = resolve_kv_dtype(inputs.kv_dtype, served)
    kv_flag = options.kv_cache_dtype(release_options, dtype, served, device, release.label)
    block_size = inputs.block_size or layout.default_block_size(spec, device)
    cached = cached_spec(inputs)
    kv_layout = layout.kv_layout(cached, dtype, tp, block_size, options=layout_options(inputs, release, dtype))
    if inputs.num_gpu_blocks_override is not None:  # the profile's KV memory is replaced by blocks x block bytes
        inputs = replace(inputs, kv_cache_memory_bytes=inputs.num_gpu_blocks_override * kv_layout.bytes_per_block)
    model_limit = common.model_limit(spec)
    fixed_len = inputs.max_model_len if isinstance(inputs.max_model_len, int) else model_limit
    gpu = inputs.gpu
    engine_total = common.device_total(inputs) if gpu else None
    defaults = budget.batch_defaults(device, engine_total, gpu.name if gpu else "", tp, release, fixed_len)
    batched, default_seqs = budget.resolve_batch(defaults, fixed_len, inputs.batched_tokens, inputs.max_num_seqs)
    in_flight = budget.max_in_flight_tokens(batched, device, release)
    requested_seqs = inputs.concurrency * inputs.workload.sequences if isinstance(inputs.concurrency, int) else 0
    sampler_seqs = max(default_seqs, requested_seqs)
    if chosen_seqs is not None and inputs.max_num_seqs is None:
        sampler_seqs = chosen_seqs
    draft, stage_blocks, page = _budget(inputs, release, kv_layout, batched, sampler_seqs, sizing)
    if sizing.extensible and stage_blocks is None:
        stage_blocks = layout.committed_blocks(kv_layout, max(draft.kv_bytes, 0))
    draft.notes.insert(1, f"KV sizing: {sizing.path}: {sizing.why}")
    per_stage = " on the binding pipeline stage" if inputs.pp > 1 else ""
    draft.notes.insert(
        1,
        f"KV cache layout: {kv_layout.describe()}, {format_bytes(page)} per block of {kv_layout.block_size} tokens ({page} B){per_stage}",
    )
    _speculative_notes(draft, cached)
    if kv_layout.padding_layers:
        draft.warnings.append(
            f"vLLM pads {kv_layout.padding_layers} layer slot(s) to even out its KV cache groups: that share of each block holds nothing"
        )
    if inputs.max_model_len == "auto":
        length = _auto_length(draft, kv_layout, model_limit, in_flight, stage_blocks)
        if length == 0:
            target = inputs.concurrency if isinstance(inputs.concurrency, int) else 1
            problem = f"not even 1 token per sequence fits for {target} sequence(s) under the warn level"
            return draft.plan(None, {}, Verdict(problem, kv_layout.bytes_per_block * (target + 1), draft.kv_bytes))
    else:
        length = fixed_len
    pool = layout.pool(
        kv_layout,
        max(draft.kv_bytes, 0),
        length,
        in_flight,
        release.null_block,
        release.kv_tokens_by_concurrency,
        num_blocks=stage_blocks,
    )
    tokens = _request_tokens(inputs.workload, length)
    prompt = inputs.workload.prompt_tokens if inputs.workload.prompt_tokens is not None else tokens
    lookahead = lookahead_tokens(inputs)
    per_request = kv_layout.blocks_held(min(prompt, tokens), tokens + lookahead, inputs.workload.sequences)
    prefill_extra = kv_layout.prefill_extra(tokens, in_flight)
    under_warn = _requests_within(inputs.warn_level * pool.usable_blocks, per_request, prefill_extra)
    capacity = VllmCapacity(
        num_blocks=pool.num_blocks,
        usable_blocks=pool.usable_blocks,
        block_size=kv_layout.block_size,
        bytes_per_block=page,
        kv_cache_groups=len(kv_layout.groups),
        kv_cache_size_tokens=pool.kv_cache_size_tokens,
        max_model_len=length,
        blocks_per_request_at_max_model_len=pool.blocks_per_request,
        max_concurrency=round(pool.max_concurrency, 4),
        tokens_per_request=tokens,
        blocks_per_request=per_request,
        blocks_per_request_in_prefill=per_request + prefill_extra,
        requests_under_warn=under_warn,
        requests_at_full=_requests_within(pool.usable_blocks, per_request, prefill_extra),
        warn_level=inputs.warn_level,
        max_num_batched_tokens=batched,
        max_in_flight_tokens=in_flight,
        replicas=inputs.replicas,
        engine_auto_max_model_len=layout.engine_max_model_len(
            kv_layout, max(draft.kv_bytes, 0), in_flight, model_limit, release.null_block
        ),
        sampler_sequences=sampler_seqs,
        cache_groups=tuple((group.kind, group.window, group.block_size) for group in kv_layout.groups),
    )
    paging = common.paging_note(pool.num_blocks, kv_layout.block_size, pool.num_blocks * page, len(kv_layout.groups))
    state = "; in a state group a block holds one request's recurrent state instead" if kv_layout.has_state else ""
    draft.notes.append(paging + state)
    wanted = chosen_seqs if forced and inputs.max_num_seqs is None else None
    seqs = wanted or _state_blocks_cap(draft, _max_num_seqs(draft, under_warn, defaults), kv_layout, pool)
    engine_flags = _flags(inputs, length, draft, seqs, batched, block_size, kv_flag, release_options, page)
    _warnings(draft, kv_layout, dtype, capacity)
    return draft.plan(capacity, engine_flags, _verdict(draft, kv_layout, pool, capacity, seqs))


def cached_spec(inputs: PlanInputs) -> ModelSpec:
    """The layers whose caches share the pool: the target's, then a drafter's (EAGLE head, draft model, MTP)."""
    speculative, spec = inputs.speculative, inputs.spec
    if speculative is None:
        return spec
    if speculative.method == "mtp":
        caches = layout.mtp_caches(spec)
        if not caches:
            raise UsageError(
                f"--speculative-config method mtp: {spec.name} has no MTP layers (num_nextn_predict_layers or mtp_num_hidden_layers in its config); use eagle/eagle3 with a draft head, or draft_model"
            )
        return layout.with_draft_layers(spec, caches)
    if speculative.draft is not None and speculative.method in ("eagle", "eagle3", "draft_model"):
        return layout.with_draft_layers(spec, [layer for _, layer in speculative.draft.caches()])
    return spec


def lookahead_tokens(inputs: PlanInputs) -> int:
    """KV slots a request reserves past its tokens for the drafter (`VllmConfig.num_lookahead_tokens`)."""
    speculative = inputs.speculative
    if speculative is None:
        return 0
    if speculative.uses_target_hidden_states or speculative.method == "draft_model":
        return speculative.tokens
    return 0


def _budget(
    inputs: PlanInputs,
    release: releases.VllmRelease,
    kv_layout: layout.KVCacheLayout,
    batched: int,
    sampler_seqs: int,
    sizing: budget.KvSizing,
) -> tuple[_Draft, int | None, int]:
    """The memory terms and the KV bytes; with pipeline parallelism, of the stage with the fewest blocks (vLLM
    gives every stage the smallest stage's block count, `get_kv_cache_configs`), that count and its block's bytes
    per GPU."""
    notes = [f"engine release: {release.label}, {release.how}"]
    if inputs.pp == 1:
        memory, kv_bytes, warnings = budget.memory_terms(inputs, release, batched, sampler_seqs, sizing=sizing)
        return _Draft(inputs, memory, kv_bytes, warnings, notes, release), None, kv_layout.bytes_per_block
    stages = []
    for stage, layers in enumerate(stage_layers(inputs, kv_layout)):
        memory, kv_bytes, warnings = budget.memory_terms(inputs, release, batched, sampler_seqs, stage, sizing)
        stage_layout = layout.project(kv_layout, layers)
        page = stage_layout.bytes_per_block
        blocks = None
        if page:
            usable = max(kv_bytes, 0)
            blocks = (
                layout.committed_blocks(stage_layout, usable) if sizing.extensible else stage_layout.num_blocks(usable)
            )
        stages.append(_Stage(stage, memory, kv_bytes, warnings, blocks, page, len(layers)))
    binding = min(stages, key=lambda item: (item.blocks is None, item.blocks or 0, item.kv_bytes))
    draft = _Draft(inputs, binding.memory, binding.kv_bytes, binding.warnings, notes, release)
    parts = [
        f"stage {item.stage}: {item.layers} cache layers, weights {format_bytes(_term(item.memory, 'weights'))}, {item.blocks if item.blocks is not None else 'no'} blocks of {format_bytes(item.page)}"
        for item in stages
    ]
    draft.notes.append(
        f"pipeline parallel {inputs.pp}: each stage sizes its own pool and vLLM keeps the smallest block count; stage {binding.stage} binds (its terms are shown): {'; '.join(parts)}"
    )
    return draft, binding.blocks, binding.page


@dataclass(frozen=True)
class _Stage:
    stage: int
    memory: list[Term]
    kv_bytes: int
    warnings: list[str]
    blocks: int | None  # None: the stage holds no cache layers
    page: int
    layers: int


def _term(terms: list[Term], name: str) -> int:
    return next((term.bytes for term in terms if term.name == name), 0)


def stage_layers(inputs: PlanInputs, kv_layout: layout.KVCacheLayout) -> list[set[int]]:
    """The cache layers each pipeline stage holds: decoder layers as vLLM splits them (`get_pp_indices`), a
    drafter's layers on the last stage."""
    num_layers = inputs.spec.num_layers
    sizes = pipeline_partition(num_layers, inputs.pp)
    edges = [sum(sizes[:i]) for i in range(inputs.pp + 1)]
    layers = {layer for group in kv_layout.groups for layer in group.layers}
    stages = [{layer for layer in layers if edges[i] <= layer < edges[i + 1]} for i in range(inputs.pp)]
    stages[-1] |= {layer for layer in layers if layer >= num_layers}
    return stages


def _speculative_notes(draft: _Draft, cached: ModelSpec) -> None:
    inputs = draft.inputs
    speculative = inputs.speculative
    if speculative is None:
        return
    added = len(cached.caches()) - len(inputs.spec.caches())
    where = f"{added} drafter cache layer(s) share the KV pool" if added else "the drafter keeps no KV cache"
    lookahead = lookahead_tokens(inputs)
    slots = f"; each request reserves {lookahead} lookahead slot(s)" if lookahead else ""
    draft.notes.append(f"speculative decoding ({speculative.method}, {speculative.tokens} tokens): {where}{slots}")
    if _eagle_with_chunked(inputs):
        draft.notes.append(
            "chunked local attention with an EAGLE/MTP drafter: vLLM turns the hybrid KV cache manager off, so the chunked layers hold the whole context"
        )
    if speculative.draft is None and speculative.method in ("eagle", "eagle3", "draft_model"):
        draft.warnings.append(
            f"--speculative-config {speculative.method}: the draft's config was not read: its KV layers and weights are not counted"
        )


def layout_options(
    inputs: PlanInputs, release: releases.VllmRelease, dtype: KvDtype | None = None
) -> layout.LayoutOptions:
    """The engine settings of these inputs that change vLLM's KV cache layout."""
    speculative = inputs.speculative
    return layout.LayoutOptions(
        device=inputs.device,
        block_size_given=inputs.block_size is not None,
        hybrid_manager=inputs.hybrid_manager and release.hybrid_manager and not _eagle_with_chunked(inputs),
        mamba_cache_mode=inputs.mamba_cache_mode or ("none" if inputs.prefix_caching is False else "align"),
        mamba_cache_dtype=inputs.mamba_cache_dtype,
        mamba_ssm_cache_dtype=inputs.mamba_ssm_cache_dtype,
        speculative_tokens=speculative.tokens if speculative else 0,
        unquantized_layers=boundary_layers(inputs.spec, dtype, release) if dtype is not None else frozenset(),
    )


def boundary_layers(spec: ModelSpec, dtype: KvDtype, release: releases.VllmRelease) -> frozenset[int]:
    """Layers that keep the model's own KV dtype under TurboQuant and UltraQuant: the first and last two of a model
    without state layers (at most half of them), none of a hybrid (`TurboQuantConfig.get_boundary_skip_layers`,
    added to kv_cache_dtype_skip_layers by engine/arg_utils.py l.2370-2385 in the 0.34.0 wheel; from 0.20.0)."""
    if not (dtype.packing.startswith("tq:") or dtype.packing == "ultraquant") or spec.has_state:
        return frozenset()
    if not release.version.at_least(0, 20):
        return frozenset()
    layers = spec.num_layers
    n = min(2, layers // 2)
    return frozenset([*range(n), *range(layers - n, layers)])


def _eagle_with_chunked(inputs: PlanInputs) -> bool:
    """vLLM turns the hybrid KV cache manager off for chunked local attention with an EAGLE/MTP drafter
    (vllm-internals notes; `VllmConfig.__post_init__`): the chunked layers are then allocated as full attention."""
    speculative = inputs.speculative
    return bool(speculative and speculative.uses_target_hidden_states and inputs.spec.attention_chunk)


def _state_blocks_cap(draft: _Draft, seqs: int, kv_layout: layout.KVCacheLayout, pool: layout.Pool) -> int:
    """With recurrent-state layers and CUDA graphs, vLLM refuses to start when max_num_seqs exceeds the blocks
    (every decoding sequence needs one state block: 'max_num_seqs (N) exceeds available Mamba cache blocks',
    config/compilation.py)."""
    inputs = draft.inputs
    if not kv_layout.has_state or inputs.device != "gpu" or inputs.enforce_eager or seqs <= pool.num_blocks:
        return seqs
    if inputs.max_num_seqs is not None:
        draft.warnings.append(
            f"--max-num-seqs {seqs} exceeds the {pool.num_blocks} KV cache blocks: vLLM refuses to start a state-space model with CUDA graphs ('max_num_seqs exceeds available Mamba cache blocks'); lower it or add --enforce-eager"
        )
        return seqs
    draft.notes.append(
        f"max-num-seqs held to the {pool.num_blocks} KV cache blocks: each decoding sequence of a state-space model needs one state block"
    )
    return max(1, pool.num_blocks)


def _auto_length(
    draft: _Draft, kv_layout: layout.KVCacheLayout, model_limit: int, in_flight: int, blocks: int | None = None
) -> int:
    """--max-model-len auto: the longest context at which the wanted concurrency stays under the warn level."""
    inputs = draft.inputs
    total = kv_layout.num_blocks(draft.kv_bytes) if blocks is None else blocks
    total = total if draft.kv_bytes > 0 else 0
    usable = max(0, total - 1) if draft.release.null_block else total
    target = inputs.concurrency if isinstance(inputs.concurrency, int) else 1
    draft.notes.append(
        f"--max-model-len auto: the longest context at which {target} sequence(s) stay under the warn level ({inputs.warn_level:.0%} of {usable} usable blocks)"
    )
    if not usable:
        return 0
    longest = layout.longest_context(kv_layout, inputs.warn_level * usable, target, in_flight, model_limit)
    return min(model_limit, longest)


def _requests_within(blocks: float, per_request: int, prefill_extra: int) -> int:
    """How many requests fit `blocks` as the KV guard admits them: every one at its decode size, and the one whose
    prompt is being computed `prefill_extra` blocks more (a sliding window also holds the tokens in flight)."""
    if not per_request:
        return 0
    return max(0, floor((blocks - prefill_extra) / per_request))


def _request_tokens(workload: Workload, length: int) -> int:
    total = workload.total_tokens
    return length if total is None else min(total, length)


def _max_num_seqs(draft: _Draft, under_warn: int, defaults: budget.BatchDefaults) -> int:
    inputs = draft.inputs
    seqs_per_request = inputs.workload.sequences
    if inputs.max_num_seqs is not None:
        if inputs.max_num_seqs > under_warn * seqs_per_request:
            draft.warnings.append(
                f"--max-num-seqs {inputs.max_num_seqs} lets more sequences run than stay under the warn level ({under_warn * seqs_per_request}): expect KV pressure and preemptions"
            )
        return inputs.max_num_seqs
    if under_warn < 1 and draft.kv_bytes > 0:  # with no KV at all the verdict names the term that does not fit
        draft.warnings.append(
            f"not one request of the expected size stays under the warn level ({inputs.warn_level:.0%}): the watcher will degrade the service from the first long request"
        )
    wanted = max(1, under_warn) * seqs_per_request
    if isinstance(inputs.concurrency, int):
        return max(min(wanted, defaults.max_num_seqs), inputs.concurrency * seqs_per_request)
    if inputs.workload.total_tokens is None and inputs.concurrency is None and wanted < defaults.max_num_seqs:
        # No workload stated: sized for requests that fill the context, the cap would hold ShareGPT-like traffic on
        # an 8B model on one H100 to 0.07 x stock vLLM's SLO goodput (kvops simulate, 50 requests/s). vLLM's default
        # is what stock runs; the watcher and the guard handle the pressure.
        draft.notes.append(
            f"max-num-seqs: vLLM's default for this device ({defaults.max_num_seqs}): no workload stated; at the "
            f"whole context {wanted} sequences stay under the warn level (--prompt-tokens/--gen-tokens size it)"
        )
        return defaults.max_num_seqs
    if wanted > defaults.max_num_seqs:
        draft.notes.append(
            f"max-num-seqs capped at vLLM's default for this device ({defaults.max_num_seqs}; {defaults.rule}); {wanted} sequences would stay under the warn level"
        )
        return defaults.max_num_seqs
    return wanted


def _flags(
    inputs: PlanInputs,
    length: int,
    draft: _Draft,
    seqs: int,
    batched: int,
    block_size: int,
    kv_flag: str,
    release_options: options.ReleaseOptions,
    bytes_per_block: int,
) -> dict[str, Any]:
    """The `vllm serve` options of this plan, in the planned release's own option set: an option the release does
    not take is a one-line error naming the release that adds it; --gpu-memory-utilization is left unset where the
    release's default is to leave it unset (the extensible KV cache: an emitted value would cap it)."""
    release = draft.release
    pinned = inputs.kv_cache_memory_bytes is not None and inputs.num_gpu_blocks_override is None
    utilization = inputs.memory_fraction
    if utilization is None and release.emits_default_utilization and not (pinned and inputs.device == "cpu"):
        utilization = release.default_gpu_memory_utilization
    engine_flags: dict[str, Any] = {
        "model": model_argument(inputs.spec),
        "revision": inputs.spec.revision,
        "tensor-parallel-size": inputs.tp,
        "pipeline-parallel-size": inputs.pp if inputs.pp > 1 else None,
        "data-parallel-size": inputs.replicas if inputs.replicas > 1 else None,
        "enable-expert-parallel": True if inputs.expert_parallel else None,
        "dtype": _DTYPE_FLAGS.get(inputs.dtype),
        "language-model-only": True if inputs.text_only else None,
        "cpu-offload-gb": inputs.cpu_offload_bytes / (1 << 30) if inputs.cpu_offload_bytes else None,
        "speculative-config": inputs.speculative.config if inputs.speculative else None,
        "disable-hybrid-kv-cache-manager": True if not inputs.hybrid_manager else None,
        "no-enable-prefix-caching": True if inputs.prefix_caching is False and not release.v0 else None,
        "mamba-cache-mode": inputs.mamba_cache_mode,
        "mamba-cache-dtype": None if inputs.mamba_cache_dtype == "auto" else inputs.mamba_cache_dtype,
        "mamba-ssm-cache-dtype": None if inputs.mamba_ssm_cache_dtype == "auto" else inputs.mamba_ssm_cache_dtype,
        "max-model-len": length,
        "gpu-memory-utilization": utilization,
        "kv-cache-memory-bytes": draft.kv_bytes if pinned else None,
        "num-gpu-blocks-override": inputs.num_gpu_blocks_override,
        "enable-extensible-kv-cache": True if inputs.extensible_kv_cache else None,
        "no-enable-extensible-kv-cache": True if inputs.extensible_kv_cache is False else None,
        "max-num-seqs": seqs,
        "max-num-batched-tokens": batched,
        "block-size": block_size,
        "kv-cache-dtype": kv_flag,
        "enforce-eager": True if inputs.enforce_eager else None,
        "disable-custom-all-reduce": True if not inputs.custom_all_reduce else None,
        "compilation-config": inputs.compilation_config,
        "scheduler-cls": flags.GUARD_SCHEDULER if guard_named(inputs) else None,
        "max-num-queued-reqs": inputs.max_queued,
    }
    chosen = {name: value for name, value in engine_flags.items() if value is not None}
    if (
        pinned
        and not release_options.has("--kv-cache-memory-bytes")
        and release_options.has("--num-gpu-blocks-override")
    ):
        blocks = draft.kv_bytes // bytes_per_block
        chosen = {
            ("num-gpu-blocks-override" if name == "kv-cache-memory-bytes" else name): value
            for name, value in chosen.items()
        }
        chosen["num-gpu-blocks-override"] = blocks
        draft.notes.append(
            f"{release.label} has no --kv-cache-memory-bytes (from 0.10.2): the pinned {format_bytes(draft.kv_bytes)} is "
            f"emitted as --num-gpu-blocks-override {blocks} ({bytes_per_block} B per block)"
        )
    _check_block_size(release_options, block_size, release.label)
    problem = options.missing(release_options, _spelled(chosen), release.label)
    if problem:
        raise UsageError(problem)
    return chosen


def _spelled(chosen: dict[str, Any]) -> dict[str, Any]:
    """The options as the release's option table spells them (`--no-X` of a boolean is `--X`'s negation)."""
    out: dict[str, Any] = {}
    for name, value in chosen.items():
        if name == "no-enable-extensible-kv-cache":
            name = "enable-extensible-kv-cache"
        out[name] = value
    return out


def _check_block_size(release_options: options.ReleaseOptions, block_size: int, label: str) -> None:
    choices = release_options.block_sizes
    if choices is not None and block_size not in choices.values:
        raise UsageError(
            f"--block-size {block_size}: {label} takes {', '.join(map(str, choices.values))} "
            f"(vllm {release_options.read} wheel, {choices.source})"
        )


_DTYPE_FLAGS = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # vLLM's --dtype values


def guard_named(inputs: PlanInputs) -> bool:
    """The plan names the KV-guard scheduler: with --guard, or by default while the guard holds stock vLLM's
    goodput on bench/guard_goodput.py (GUARD_BY_DEFAULT). Never by default for models with recurrent-state layers:
    the guard projects their state groups as if they grew with every token (vLLM's MambaManager has no per-request
    cap) and would hold requests back."""
    if inputs.guard is not None:
        return inputs.guard
    return flags.GUARD_BY_DEFAULT and not inputs.spec.has_state


def _guard_note(inputs: PlanInputs, capacity: VllmCapacity) -> str:
    if guard_named(inputs):
        return (
            f"KV guard: --scheduler-cls {flags.GUARD_SCHEDULER} loads a plugin from vLLM's own Python: pip install "
            "kvops into the environment that runs vLLM (check there: python -c 'import kvops_vllm.scheduler'). The "
            "official image has none: --format docker/k8s leave the flag out; `kvops manifests` adds the plugin. "
            f"{_refusal_route(inputs)}"
        )
    if inputs.guard is False:
        return "KV guard: not named (--no-guard)"
    held = capacity.requests_at_full
    measured = flags.GUARD_LARGE_POOL if held >= flags.GUARD_POOL_REQUESTS else flags.GUARD_SMALL_POOL
    return (
        f"KV guard: not named by default; this pool holds {held} requests of the planned size at once, {measured}; "
        "your traffic decides: kvops simulate with this plan's options and --compare stock,guard; --guard names it "
        "(kvops installed in vLLM's own Python)"
    )


def _refusal_route(inputs: PlanInputs) -> str:
    """Where a client of this deployment gets a refusal it can retry: the guard itself only holds requests."""
    held = "At a level that refuses, the guard keeps new requests waiting in vLLM's queue (never an empty answer)"
    retry = (
        f"for 429/503 with Retry-After add --middleware {flags.MIDDLEWARE} (inside vLLM's API server; "
        "kvops manifests adds it)"
        if flags.middleware(True, inputs.replicas)
        else "for 429/503 with Retry-After put `kvops watch --proxy` in front (kvops manifests does)"
    )
    if inputs.max_queued is not None:
        return (
            f"{held}; beyond {inputs.max_queued} requests in flight (waiting + running) vLLM refuses with 503 (an error event in a stream, no "
            f"Retry-After); {retry}"
        )
    return f"{held}; {retry}, or bound the queue with --max-queued"


def _warnings(draft: _Draft, kv_layout: layout.KVCacheLayout, dtype: KvDtype, capacity: VllmCapacity) -> None:
    inputs = draft.inputs
    draft.notes.append(_guard_note(inputs, capacity))
    spec, length = inputs.spec, capacity.max_model_len
    if spec.max_position_embeddings and length > spec.max_position_embeddings:
        draft.warnings.append(
            f"--max-model-len {length} exceeds {spec.name}'s max_position_embeddings {spec.max_position_embeddings}; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    windows = sorted({group.window for group in kv_layout.groups if group.kind == "sliding" and group.window})
    if windows:
        draft.notes.append(
            f"sliding-window layers (window {', '.join(map(str, windows))}) hold about window + {capacity.max_in_flight_tokens} tokens in flight per request, not the whole context"
        )
    if dtype.is_quantized and dtype.scales == "per_token_head":
        draft.warnings.append(f"--kv-dtype {dtype.name}: {common.QUALITY_WARNING}")
    if spec.num_kv_heads < inputs.tp and not spec.is_mla:
        draft.notes.append(
            f"tp {inputs.tp} > {spec.num_kv_heads} KV heads: each KV head is replicated on {inputs.tp // spec.num_kv_heads} ranks, per-GPU KV does not shrink further"
        )
    if inputs.guard is None and spec.has_state:
        draft.notes.append(
            "the KV guard scheduler is not named: it does not yet model the state groups of hybrid models (--guard names it anyway)"
        )
    if inputs.workload.sequences > 1:
        draft.notes.append(
            f"{inputs.workload.sequences} sequences per request (n x beams): vLLM runs each as its own request; with prefix caching the prompt's full blocks are shared"
        )


_NOT_SPENT = ("total", "requested", "kv_cache", "margin", "headroom")


def _verdict(
    draft: _Draft, kv_layout: layout.KVCacheLayout, pool: layout.Pool, capacity: VllmCapacity, seqs: int
) -> Verdict | None:
    inputs, kv = draft.inputs, draft.kv_bytes
    terms = {term.name: term.bytes for term in draft.memory}
    if kv <= 0:
        others = sum(term.bytes for term in draft.memory if term.name not in _NOT_SPENT)
        have = terms["requested"]
        total = common.device_total(inputs)
        utilization = inputs.memory_fraction or draft.release.default_gpu_memory_utilization
        return Verdict(
            f"{common.what_does_not_fit(terms, have)} need {format_bytes(others)} per GPU but vLLM may use {format_bytes(have)} ({utilization:g} of {format_bytes(total)}); nothing is left for the KV cache",
            others + kv_layout.bytes_per_block * (pool.blocks_per_request + 1),
            have,
            states_need=True,
        )
    if terms.get("headroom", 0) < 0:
        total = common.device_total(inputs)
        need = total - terms["headroom"]
        return Verdict(
            f"weights, overheads and the pinned {format_bytes(kv)} KV cache need {format_bytes(need)} per GPU; the device has {format_bytes(total)}",
            need,
            total,
            states_need=True,
        )
    if not pool.fits_one_request:
        return _too_short_verdict(draft, kv_layout, pool, capacity)
    refused = _state_blocks_refusal(draft, kv_layout, pool, seqs)
    if refused is not None:
        return refused
    asked = inputs.workload.total_tokens
    if asked is not None and asked > pool.max_model_len:
        need = layout.kv_bytes_needed(kv_layout, ceil(asked / pool.block_size))
        return Verdict(
            f"requests of {asked} tokens (prompt + gen) exceed --max-model-len {pool.max_model_len}: vLLM rejects "
            "every one of them ('maximum context length'); raise --max-model-len or state shorter requests",
            need,
            kv,
            states_need=True,
        )
    per_request, under_warn = capacity.blocks_per_request, capacity.requests_under_warn
    if isinstance(inputs.concurrency, int) and inputs.concurrency > under_warn:
        held = inputs.concurrency * per_request + capacity.blocks_per_request_in_prefill - per_request
        blocks = ceil(held / inputs.warn_level)
        need = layout.kv_bytes_needed(kv_layout, blocks)
        return Verdict(
            f"{inputs.concurrency} concurrent requests of {capacity.tokens_per_request} tokens need {held} blocks, {blocks} with the {inputs.warn_level:.0%} warn level = {format_bytes(need)} of KV cache; the plan has {format_bytes(kv)} ({pool.usable_blocks} usable blocks: {under_warn} under the warn level)",
            need,
            kv,
            states_need=True,
        )
    if inputs.concurrency == "auto" and under_warn < 1:
        need = layout.kv_bytes_needed(kv_layout, ceil(capacity.blocks_per_request_in_prefill / inputs.warn_level))
        return Verdict(
            f"not one request of {capacity.tokens_per_request} tokens stays under the warn level ({per_request} blocks of {pool.usable_blocks})",
            need,
            kv,
        )
    return None


def _state_blocks_refusal(
    draft: _Draft, kv_layout: layout.KVCacheLayout, pool: layout.Pool, seqs: int
) -> Verdict | None:
    """vLLM refuses to start a model with state layers under full CUDA graphs when max_num_seqs exceeds the KV cache
    blocks (releases.VllmRelease.refuses_seqs_above_state_blocks): the plan does not fit, in vLLM's words."""
    inputs = draft.inputs
    if not kv_layout.has_state or inputs.device != "gpu" or inputs.enforce_eager or seqs <= pool.num_blocks:
        return None
    if not draft.release.refuses_seqs_above_state_blocks:
        return None
    need = layout.kv_bytes_needed(kv_layout, seqs)
    return Verdict(
        f"{draft.release.label} refuses to start: 'max_num_seqs ({seqs}) exceeds available Mamba cache blocks "
        f"({pool.num_blocks}). Each decode sequence requires one Mamba cache block' (config/compilation.py "
        f"resolve_cudagraph_mode_and_sizes): lower --max-num-seqs to {pool.num_blocks}, add --enforce-eager, or give "
        f"the KV cache {format_bytes(need)}",
        need,
        draft.kv_bytes,
        states_need=True,
    )


def _too_short_verdict(
    draft: _Draft, kv_layout: layout.KVCacheLayout, pool: layout.Pool, capacity: VllmCapacity
) -> Verdict:
    """One request at max-model-len does not fit the KV memory: the engine's startup check, in its words."""
    length, kv = pool.max_model_len, draft.kv_bytes
    # the error's estimate searches up to the max_model_len asked for (`_estimate_max_model_len_from_groups`)
    longest = layout.engine_max_model_len(kv_layout, max(kv, 0), capacity.max_in_flight_tokens, length, True)
    need = layout.kv_bytes_needed(kv_layout, pool.blocks_per_request)
    blocks = f"one request at --max-model-len {length} needs {pool.blocks_per_request} blocks"
    if not draft.release.null_block:
        tokens = pool.num_blocks * pool.block_size
        refusal = (
            f"{draft.release.label} refuses to start: 'The model's max seq len ({length}) is larger than the maximum "
            f"number of tokens that can be stored in KV cache ({tokens})'"
        )
        return Verdict(
            f"{blocks} of {pool.block_size} tokens; the KV cache holds {pool.num_blocks} ({tokens:,} tokens): {refusal}",
            need,
            kv,
            states_need=True,
        )
    estimate = f"; the estimated maximum model length is {longest}" if longest else ""
    return Verdict(
        f"{blocks} = {format_bytes(need)} of KV cache (block 0 is the null block), more than the {format_bytes(kv)} vLLM has "
        "(vLLM refuses to start: 'To serve at least one request with the model's max seq len ... KV cache is "
        f"needed, which is larger than the available KV cache memory'){estimate}",
        need,
        kv,
        states_need=True,
    )


# --- the ways out this engine offers --------------------------------------------------------------------

PCIE_BYTES_PER_SECOND = 25 * 10**9  # PCIe 4.0 x16, what host<->GPU copies reach in practice (an estimate)


def _release_options(inputs: PlanInputs) -> tuple[releases.VllmRelease, options.ReleaseOptions]:
    release = releases.release(inputs.engine_version)
    return release, options.for_version(release.version)


def kv_dtype_ways(inputs: PlanInputs) -> list[str]:
    """The quantized KV dtypes to try, least lossy first, that the planned release takes (int8 and int4 per token
    and head from 0.20.0 and 0.25.0): the CPU build's attention takes fp8 only."""
    _, release_options = _release_options(inputs)
    return options.kv_ways(release_options, inputs.device, inputs.gpu.vendor if inputs.gpu else None)


def kv_dtype_spelling(inputs: PlanInputs, name: str) -> str:
    """How the planned release is told to keep the KV cache in `name`."""
    release, release_options = _release_options(inputs)
    dtype = resolve_kv_dtype(name, inputs.spec.dtype)
    value = options.kv_cache_dtype(release_options, dtype, inputs.spec.dtype, inputs.device, release.label)
    return f"{name} KV, vLLM --kv-cache-dtype {value}"


def offload_ways(inputs: PlanInputs, failed: Plan) -> list[WayOut]:
    """Host memory instead of GPU memory: weights (UVA) or evicted KV blocks; described, not re-planned."""
    if inputs.device != "gpu" or failed.need_bytes is None or failed.have_bytes is None:
        return []
    _, release_options = _release_options(inputs)
    short = max(0, failed.need_bytes - max(failed.have_bytes, 0))
    if short <= 0:
        return []
    gib = ceil(short / (1 << 30))
    seconds = gib * (1 << 30) / PCIE_BYTES_PER_SECOND
    weights = failed.term("weights")
    ways = []
    if weights and gib * (1 << 30) < weights.bytes and release_options.has("--cpu-offload-gb"):
        ways.append(
            WayOut(
                f"--cpu-offload-gb {gib}",
                None,
                f"moves {gib} GiB of weights per GPU to host memory (UVA), freeing it for KV; every forward step streams them over PCIe: ~{seconds * 1000:.0f} ms per step at ~25 GB/s (an estimate)",
                "decode slows by that much on every token",
            )
        )
    if failed.kv_cache_bytes <= 0 or not release_options.has("--kv-offloading-size"):
        return ways  # the weights and overheads do not fit (host memory for KV blocks changes nothing), or no tier
    if failed.capacity is None or failed.capacity.requests_at_full < 1:
        return ways  # one request does not fit the GPU's blocks: a host tier holds evicted blocks, not a longer one
    ways.append(
        WayOut(
            f"--kv-offloading-size {gib * inputs.tp} --kv-offloading-backend native",
            None,
            f"keeps {gib * inputs.tp} GiB (all TP ranks) of evicted KV blocks in host memory, so preempted and repeated prefixes reload over PCIe (~{seconds * 1000:.0f} ms per {gib} GiB) instead of being recomputed; it does not raise how many sequences run at once",
            f"costs {gib * inputs.tp} GiB of host RAM",
        )
    )
    return ways
