"""The vLLM plan, pass by pass: the memory budget (budget.py), the KV cache layout and pool (layout.py) and the batch
the workload needs, here; the `vllm serve` flags (launch.py), whether it fits (verdict.py), what it says beside its
figures (notes.py, drafting.py) and, through the engine's interface, its ways out (ways_out.py)."""

from __future__ import annotations

from dataclasses import replace
from math import floor
from typing import Any

from kvops.dtypes import KvDtype, resolve_kv_dtype, serving_dtype
from kvops.engines import common
from kvops.engines.vllm import architectures, budget, context, layout, options, releases
from kvops.engines.vllm.capacity import CacheGroup, Draft, VllmCapacity
from kvops.engines.vllm.drafting import eagle_with_chunked, lookahead_tokens, speculative_notes
from kvops.engines.vllm.launch import engine_flags
from kvops.engines.vllm.notes import add_notes
from kvops.engines.vllm.verdict import verdict
from kvops.engines.weights import weight_format
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.model.checkpoint import pipeline_partition
from kvops.model.spec import ModelSpec, SlidingWindow
from kvops.plan import Plan, PlanInputs, Term, Verdict
from kvops.units import format_bytes
from kvops.workload import Workload

MAX_SEQS_PASSES = 4  # the profile's sampler runs the emitted max_num_seqs: re-plan until the two agree


def plan_once(inputs: PlanInputs) -> Plan:
    """The vLLM plan for these inputs, fitting or not (no ways out: the planner searches those). The profile's
    sampler is sized for the --max-num-seqs the plan emits, as vLLM's `_dummy_sampler_run` runs it: the plan is
    re-made with the sequences it chose until they agree."""
    if inputs.device not in budget.DEVICES:
        raise UsageError(f"--device {inputs.device!r}; valid: {', '.join(budget.DEVICES)}")
    release = releases.release(inputs.engine_version)
    architectures.check_served(inputs.spec, release.version, release.label)
    architectures.check_built(inputs.spec, release.label)
    _check_skip_layers(inputs.spec, inputs.kv_skip_layers)
    if inputs.disable_sliding_window:
        inputs = _full_attention(inputs)
    sizing = budget.kv_sizing(inputs, release)
    release = replace(release, extensible=sizing.extensible)
    chosen: int | None = None
    seen: list[int] = []
    for _ in range(MAX_SEQS_PASSES):
        plan = _plan_pass(inputs, release, sizing, chosen)
        seqs = plan.flags.get("max-num-seqs")
        if inputs.as_run or inputs.max_num_seqs is not None or not isinstance(seqs, int):
            return plan
        if plan.capacity is not None and plan.capacity.sampler_sequences == seqs:  # type: ignore[attr-defined]
            return plan
        chosen = seqs
        seen.append(seqs)
    return _plan_pass(inputs, release, sizing, _settled_seqs(inputs, release, sizing, max(seen)), forced=True)


def _full_attention(inputs: PlanInputs) -> PlanInputs:
    """--disable-sliding-window: the model with full attention in every layer and its context cut to the window;
    vLLM refuses a longer --max-model-len ('User-specified max_model_len ... is greater than the derived
    max_model_len', ModelConfig.get_and_verify_max_len)."""
    spec = inputs.spec.without_sliding_window(context.configured_window(inputs.spec))
    window = inputs.spec.sliding_window
    cap = None if window is None else context.max_len_limit(spec)  # the window (if shorter), RoPE-scaled
    if cap is not None and isinstance(inputs.max_model_len, int) and inputs.max_model_len > cap:
        raise UsageError(
            f"--max-model-len {inputs.max_model_len} with --disable-sliding-window: vLLM caps {inputs.spec.name}'s "
            f"context at its sliding window, {cap} tokens; lower it or keep the window"
        )
    return replace(inputs, spec=spec)


def _settled_seqs(inputs: PlanInputs, release: releases.VllmRelease, sizing: budget.KvSizing, high: int) -> int:
    """The most sequences a plan can both size the profile's sampler for and choose. The more the sampler runs,
    the less KV is left and the fewer sequences a plan chooses, so re-planning with each pass's choice can swing
    (a hybrid model's state blocks bound the choice: on four RTX 3090s a sampler for 23 sequences of
    Qwen3.5-35B-A3B leaves 15 blocks); bisect for the largest count whose pass chooses at least as many. More
    memory never lowers it."""
    low = 1
    while low < high:
        middle = (low + high + 1) // 2
        chosen = _plan_pass(inputs, release, sizing, middle).flags.get("max-num-seqs")
        if isinstance(chosen, int) and chosen >= middle:
            low = middle
        else:
            high = middle - 1
    return low


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
    options.check_weight_format(release_options, weight_format(spec, inputs.quantization).name, release.label)
    served = spec.dtype if inputs.dtype == "auto" else serving_dtype(inputs.dtype)  # kv dtype auto follows --dtype
    dtype = resolve_kv_dtype(inputs.kv_dtype, served)
    kv_flag = options.kv_cache_dtype(release_options, dtype, served, device, release.label)
    gpu = releases.nvidia_id(inputs.gpu)
    gpu_block = release.gpu_block_size(gpu, mm_prefix_head(spec, inputs.text_only))
    mla_block = release.gpu_mla_block_size(gpu, dtype.bits == 8)
    block_size = inputs.block_size or layout.default_block_size(spec, device, inputs.cpu_amx, gpu_block, mla_block)
    cached = cached_spec(inputs)
    layout.check_dcp(cached, tp, inputs.dcp)
    _check_pp(spec, inputs.pp)
    layout_settings = layout_options(inputs, release, dtype)
    kv_layout = layout.kv_layout(cached, dtype, tp, block_size, options=layout_settings)
    if inputs.num_gpu_blocks_override is not None:  # the profile's KV memory is replaced by blocks x block bytes
        inputs = replace(inputs, kv_cache_memory_bytes=inputs.num_gpu_blocks_override * kv_layout.bytes_per_block)
    model_limit = context.model_limit(spec, inputs.max_model_len)
    given = inputs.max_model_len
    fixed_len = given if isinstance(given, int) else model_limit if given == "auto" else context.model_default(spec)
    defaults = budget.launch_defaults(inputs, release, fixed_len)
    batched, default_seqs = budget.resolve_batch(
        defaults, fixed_len, inputs.batched_tokens, inputs.max_num_seqs, inputs.chunked_prefill
    )
    runner = budget.model_runner_of(inputs, release) if device != "cpu" and not release.v0 else None
    in_flight = budget.max_in_flight_tokens(
        batched, device, release, budget.async_scheduling(inputs), inputs.pp, bool(runner and runner.v2)
    )
    requested_seqs = inputs.concurrency * inputs.workload.sequences if isinstance(inputs.concurrency, int) else 0
    engine_seqs = max(default_seqs, requested_seqs)
    sampler_seqs = chosen_seqs if chosen_seqs is not None and inputs.max_num_seqs is None else engine_seqs
    sequences = budget.Sequences(sampler_seqs, engine_seqs)
    draft, stage_blocks, page = _budget(inputs, release, kv_layout, batched, sequences, sizing)
    if sizing.extensible and stage_blocks is None:
        stage_blocks = layout.committed_blocks(kv_layout, max(draft.kv_bytes, 0))
    draft.notes.insert(1, f"KV sizing: {sizing.path}: {sizing.why}")
    if runner is not None:
        draft.notes.insert(2, f"model runner: {'V2' if runner.v2 else 'V1'}: {runner.why}")
    per_stage = " on the binding pipeline stage" if inputs.pp > 1 else ""
    spread = f", {block_size} on each of the {inputs.dcp} decode-context-parallel ranks" if inputs.dcp > 1 else ""
    draft.notes.insert(
        1,
        f"KV cache layout: {kv_layout.describe()}, {format_bytes(page)} per block of {kv_layout.block_size} tokens"
        f"{spread} ({page} B){per_stage}{_state_pages(kv_layout, layout_settings.mamba_cache_mode, inputs, release)}",
    )
    speculative_notes(draft, cached)
    if given is None and context.config_context(spec) is None:
        draft.notes.append(
            f"max-model-len {context.UNNAMED_CONTEXT}: the config names no context, and vLLM runs this one (it warns "
            "so: vllm/config/model.py _get_and_verify_max_len); give --max-model-len for another"
        )
    if kv_layout.padding_layers:
        draft.warnings.append(
            f"vLLM pads {kv_layout.padding_layers} layer slot(s) to even out its KV cache groups: that share of each block holds nothing"
        )
    if inputs.max_model_len == "auto":
        whole_prompts = model_limit if inputs.chunked_prefill else min(model_limit, batched)
        length = _auto_length(draft, kv_layout, whole_prompts, in_flight, stage_blocks)
        if length == 0:
            target = inputs.concurrency if isinstance(inputs.concurrency, int) else 1
            problem = f"not even 1 token per sequence fits for {target} sequence(s) under the warn level"
            return draft.plan(None, {}, Verdict(problem, kv_layout.bytes_per_block * (target + 1), draft.kv_bytes))
    else:
        length = fixed_len
    if not inputs.chunked_prefill:
        _check_whole_prompts(batched, length)
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
        cache_groups=tuple(_cache_group(group, layout_settings.mamba_cache_mode) for group in kv_layout.groups),
    )
    paging = common.paging_note(pool.num_blocks, kv_layout.block_size, pool.num_blocks * page, len(kv_layout.groups))
    state = "; in a state group a block holds one request's recurrent state instead" if kv_layout.has_state else ""
    draft.notes.append(paging + state)
    wanted = chosen_seqs if forced and inputs.max_num_seqs is None else None
    seqs = wanted or _state_blocks_cap(draft, _max_num_seqs(draft, under_warn, defaults), kv_layout, pool)
    seqs = _within_token_budget(inputs, seqs, batched)
    _check_scheduler_flags(dict(inputs.scheduler_flags), seqs, length)
    chosen = engine_flags(inputs, length, draft, seqs, batched, block_size, kv_flag, release_options, page)
    add_notes(draft, kv_layout, dtype, capacity)
    return draft.plan(capacity, chosen, verdict(draft, kv_layout, pool, capacity, seqs))


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


def _budget(
    inputs: PlanInputs,
    release: releases.VllmRelease,
    kv_layout: layout.KVCacheLayout,
    batched: int,
    seqs: budget.Sequences,
    sizing: budget.KvSizing,
) -> tuple[Draft, int | None, int]:
    """The memory terms and the KV bytes; with pipeline parallelism, of the stage with the fewest blocks (vLLM
    gives every stage the smallest stage's block count, `get_kv_cache_configs`), that count and its block's bytes
    per GPU."""
    notes = [f"engine release: {release.label}, {release.how}"]
    if inputs.pp == 1:
        memory, kv_bytes, warnings = budget.memory_terms(inputs, release, batched, seqs, sizing=sizing)
        return Draft(inputs, memory, kv_bytes, warnings, notes, release), None, kv_layout.bytes_per_block
    stages = []
    for stage, layers in enumerate(stage_layers(inputs, kv_layout)):
        memory, kv_bytes, warnings = budget.memory_terms(inputs, release, batched, seqs, stage, sizing)
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
    draft = Draft(inputs, binding.memory, binding.kv_bytes, binding.warnings, notes, release)
    parts = [
        f"stage {item.stage}: {item.layers} cache layers, weights {format_bytes(_term(item.memory, 'weights'))}, {item.blocks if item.blocks is not None else 'no'} blocks of {format_bytes(item.page)}"
        for item in stages
    ]
    draft.notes.append(
        f"pipeline parallel {inputs.pp}: each stage sizes its own pool and vLLM keeps the smallest block count; stage {binding.stage} binds (its terms are shown): {'; '.join(parts)}"
    )
    return draft, binding.blocks, binding.page


@frozen
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


def _check_pp(spec: ModelSpec, pp: int) -> None:
    """vLLM splits the decoder layers over the stages (`get_pp_indices`): past one a stage, stages hold none."""
    if pp > spec.num_layers:
        raise UsageError(
            f"--pipeline-parallel-size {pp}: {spec.name} has {spec.num_layers} decoder layers to split over the "
            f"stages, at least one each; give at most {spec.num_layers}"
        )


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


def _cache_group(group: layout.KVCacheGroup, mamba_cache_mode: str) -> CacheGroup:
    """A group as the scheduler sees it; a state group in the mode vLLM runs it in, with its checkpoint pages."""
    if group.kind != "mamba":
        return CacheGroup(group.kind, group.window, group.block_size)
    return CacheGroup(group.kind, None, group.block_size, mamba_cache_mode, group.spec.checkpoint_pages)


def layout_options(
    inputs: PlanInputs, release: releases.VllmRelease, dtype: KvDtype | None = None
) -> layout.LayoutOptions:
    """The engine settings of these inputs that change vLLM's KV cache layout."""
    speculative = inputs.speculative
    gpu = releases.nvidia_id(inputs.gpu)
    return layout.LayoutOptions(
        device=inputs.device,
        block_size_given=inputs.block_size is not None,
        hybrid_manager=inputs.hybrid_manager and release.hybrid_manager and not eagle_with_chunked(inputs),
        mamba_cache_mode=mamba_cache_mode(inputs, release),
        mamba2_prefill_checkpoint=release.mamba2_prefill_checkpoint,
        gdn_prefill_checkpoint=inputs.device == "gpu"
        and release.gdn_prefill_checkpoints(
            inputs.gpu.id if inputs.gpu else None, layout.gdn_key_head_dim(inputs.spec)
        ),
        mamba_cache_dtype=inputs.mamba_cache_dtype,
        mamba_ssm_cache_dtype=inputs.mamba_ssm_cache_dtype,
        cpu_avx512_bf16=inputs.cpu_avx512_bf16,
        speculative_tokens=speculative.tokens if speculative else 0,
        unquantized_layers=unquantized_layers(inputs, dtype, release) if dtype is not None else frozenset(),
        dcp=inputs.dcp,
        fp8_ds_mla=release.sparse_mla_fp8_ds(gpu),
        ds_mla_always=release.sparse_mla_always_ds(gpu),
    )


def mm_prefix_head(spec: ModelSpec, text_only: bool) -> int | None:
    """The head size of a model whose attention vLLM runs with mm-prefix (bidirectional image-token) attention: a
    multimodal model of `MM_PREFIX_LM_MODELS` served with its images (not --language-model-only, nor every
    --limit-mm-per-prompt at 0: `ModelConfig._supports_multimodal_for_mm_prefix`, config/model.py). None otherwise."""
    model_type = (spec.config_json or {}).get("model_type")
    attention = spec.attention_layers()
    if text_only or model_type not in releases.MM_PREFIX_LM_MODELS or not attention:
        return None
    return attention[0].head_dim


# Models whose state vLLM caches per block of tokens with prefix caching (SupportsMambaPrefixCaching in
# model_executor/models/: falcon_h1, granitemoehybrid, jamba, mamba, mamba2, nemotron_h, zamba2; 0.28.0 and 0.32.0)
STATE_PER_BLOCK_MODELS = frozenset(
    ("falcon_h1", "granitemoehybrid", "jamba", "mamba", "mamba2", "nemotron_h", "zamba2")
)


def mamba_cache_mode(inputs: PlanInputs, release: releases.VllmRelease) -> str:
    """The mamba cache mode vLLM runs a model with state layers in (model_executor/models/config.py
    MambaModelConfig.verify_and_update_config): 'none' without prefix caching; with it, 'all' (a state page per
    block of tokens) for the models that support it through 0.27 and where asked through 0.31, else 'align'
    ('all' falls back to it); 0.12-0.14 had no mode and turned prefix caching off for the other models."""
    asked = inputs.mamba_cache_mode
    if asked == "all" and not release.mamba_states_per_block:
        raise UsageError(
            f"--mamba-cache-mode all: vLLM {release.version} takes align or none (its config/cache.py MambaCacheMode; "
            "'all' was taken by 0.15 to 0.31)"
        )
    per_block = release.mamba_states_per_block and inputs.spec.model_type in STATE_PER_BLOCK_MODELS
    if asked is not None:
        return "align" if asked == "all" and not per_block else asked
    if not _prefix_caching(inputs, release):
        return "none"
    if not release.has_mamba_cache_mode:
        return "all" if per_block else "none"
    return "all" if per_block and not release.hybrid_prefix_caching else "align"


def _state_pages(kv_layout: layout.KVCacheLayout, mode: str, inputs: PlanInputs, release: releases.VllmRelease) -> str:
    """What a request holds in each state group in mamba cache mode `mode`, and the setting that decides it."""
    states = [group.spec for group in kv_layout.groups if group.kind == "mamba"]
    if not states:
        return ""
    if inputs.mamba_cache_mode:
        why = f"mamba cache mode {mode}: --mamba-cache-mode {inputs.mamba_cache_mode}"
    elif inputs.prefix_caching is not None and release.hybrid_prefix_caching_allowed:
        why = f"mamba cache mode {mode}: prefix caching {'on' if inputs.prefix_caching else 'off'}, as asked"
    else:
        default = "on" if _prefix_caching(inputs, release) else "off"
        why = f"mamba cache mode {mode}: prefix caching {default}, vLLM {release.version}'s default for models with state layers"
    pages = sorted({spec.state_pages for spec in states})
    count = "/".join(map(str, pages)) + (" page" if pages == [1] else " pages")
    if states[0].state_per_block:
        count = f"one page per block of its tokens{f' and {count}' if pages != [0] else ''}"
    return f"; each request holds {count} in each state group ({why})"


def _prefix_caching(inputs: PlanInputs, release: releases.VllmRelease) -> bool:
    """Whether a model with state layers runs with prefix caching: as asked, else the release's default."""
    if not release.hybrid_prefix_caching_allowed:
        return False
    return inputs.prefix_caching if inputs.prefix_caching is not None else release.hybrid_prefix_caching


def unquantized_layers(inputs: PlanInputs, dtype: KvDtype, release: releases.VllmRelease) -> frozenset[int]:
    """Layers whose KV cache keeps the model's own dtype: TurboQuant's boundary layers, and those
    --kv-cache-dtype-skip-layers names (an index, or every sliding-window layer)."""
    spec, named = inputs.spec, inputs.kv_skip_layers
    skipped = {int(item) for item in named if item.isdigit()}
    if "sliding_window" in named:
        skipped |= {index for index, layer in spec.caches() if isinstance(layer, SlidingWindow)}
    return boundary_layers(spec, dtype, release) | skipped


def _check_skip_layers(spec: ModelSpec, named: tuple[str, ...]) -> None:
    """An index past the model's layers matches no layer in vLLM (attention.py compares it with each layer's own
    index): the cache stays quantized where the user meant to keep it whole, so it is refused."""
    last = spec.num_layers - 1
    beyond = [item for item in named if item.isdigit() and int(item) > last]
    if beyond:
        raise UsageError(
            f"--kv-cache-dtype-skip-layers {','.join(beyond)}: {spec.name} has {spec.num_layers} layers; "
            f"valid: 0 to {last}, or sliding_window (vLLM matches no layer to it)"
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


def _check_whole_prompts(batched: int, length: int) -> None:
    """Chunked prefill off: vLLM takes each prompt whole, so it refuses a token budget below the context
    (SchedulerConfig.verify_max_model_len, vllm/config/scheduler.py)."""
    if batched < length:
        raise UsageError(
            f"--max-num-batched-tokens {batched} is smaller than --max-model-len {length} with chunked prefill off: "
            f"vLLM refuses to start (each prompt runs whole); raise it to {length} or lower --max-model-len"
        )


def _within_token_budget(inputs: PlanInputs, seqs: int, batched: int) -> int:
    """vLLM refuses max_num_seqs above max_num_batched_tokens once given ('max_num_batched_tokens (N) must be greater
    than or equal to max_num_seqs', SchedulerConfig.verify_max_model_len); its own default is cut to the budget
    (`_set_default_max_num_seqs_and_batched_tokens_args`), and so is kvops' choice."""
    if inputs.max_num_seqs is None:
        return min(seqs, batched)
    if seqs > batched:
        raise UsageError(
            f"--max-num-seqs {seqs} is above --max-num-batched-tokens {batched}: vLLM refuses to start (every "
            f"sequence takes a token of a step's budget); give at most {batched} sequences or a larger budget"
        )
    return seqs


def _check_scheduler_flags(flags: dict[str, Any], seqs: int, length: int) -> None:
    """A pasted command's scheduler flags that vLLM refuses beside the plan's --max-num-seqs and --max-model-len
    (SchedulerConfig.verify_max_model_len, vllm/config/scheduler.py, 0.32.0-0.34.0)."""
    active = flags.get("max_num_active_seqs")
    if active is not None and active > seqs:
        raise UsageError(
            f"--max-num-active-seqs {active} is above --max-num-seqs {seqs}: vLLM refuses to start ('max_num_active_seqs "
            f"cannot be greater than max_num_seqs'); give at most {seqs}, or --max-num-seqs {active}"
        )
    threshold = flags.get("long_prefill_token_threshold")
    if threshold is not None and threshold > length:
        raise UsageError(
            f"--long-prefill-token-threshold {threshold} is above --max-model-len {length}: vLLM refuses to start "
            f"('long_prefill_token_threshold cannot be greater than the max_model_len'); give at most {length}"
        )


def _state_blocks_cap(draft: Draft, seqs: int, kv_layout: layout.KVCacheLayout, pool: layout.Pool) -> int:
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
    draft: Draft, kv_layout: layout.KVCacheLayout, model_limit: int, in_flight: int, blocks: int | None = None
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


def _max_num_seqs(draft: Draft, under_warn: int, defaults: budget.BatchDefaults) -> int:
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
    if inputs.concurrency is None and wanted < defaults.max_num_seqs:
        # A cap at the warn level leaves the pool's last 30% idle when traffic peaks: sized for requests that fill
        # the context it held ShareGPT-like traffic on an 8B model on one H100 to 0.07 x stock vLLM's SLO goodput
        # (kvops simulate, 50 requests/s), and sized for the stated requests (2,000 + 500 tokens, Llama-3-8B on an
        # H100) to 0.67 x at stock's saturation rate and 0.47-0.58 x past it (docs/measured.md). vLLM's default is
        # what stock runs; the watcher and the guard handle the pressure.
        stated = (
            "no workload stated; at the whole context"
            if inputs.workload.total_tokens is None
            else "of the stated requests,"
        )
        draft.notes.append(
            f"max-num-seqs: vLLM's default for this device ({defaults.max_num_seqs}), as stock runs: {stated} "
            f"{wanted} sequences stay under the warn level; past them the watcher warns and the guard, where named, "
            "admits by projected KV (a cap there left the pool's last 30% idle and cost goodput at saturation)"
        )
        return defaults.max_num_seqs
    if wanted > defaults.max_num_seqs:
        draft.notes.append(
            f"max-num-seqs capped at vLLM's default for this device ({defaults.max_num_seqs}; {defaults.rule}); {wanted} sequences would stay under the warn level"
        )
        return defaults.max_num_seqs
    return wanted
