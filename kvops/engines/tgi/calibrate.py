"""Calibrating a TGI run: what its launcher log measured (the KV pool in tokens and blocks), against the plan; the
profile that replaces the planner's estimates; and the observation the corpus fit takes from it."""

from __future__ import annotations

from kvops.calibration import Calibration, Comparison, predicted_figures
from kvops.engines.tgi import budget
from kvops.engines.tgi.logs import TgiLog
from kvops.engines.tgi.plan import TgiCapacity
from kvops.engines.tgi.releases import TgiRelease
from kvops.overheads import Observation
from kvops.plan import Plan
from kvops.profile import Profile
from kvops.units import format_bytes

# An overhead this many times kvops' own estimate, or below zero, says the log's pool came from another GPU or
# launch than the one the plan describes (an L4 log calibrated as an H100 implied +1805%).
IMPLAUSIBLE_OVERHEAD = 4


def calibrate(log: TgiLog, plan: Plan | None, source: str) -> Calibration:
    predicted = predicted_figures(plan)
    rows: list[Comparison] = []
    notes: list[str] = []
    warnings: list[str] = []
    total_tokens = log.get("max_batch_total_tokens")
    failed = log.get("pool_out_of_memory")
    stated = failed[0] if failed else log.args.get("max_batch_total_tokens")
    stated_pool = plan is not None and isinstance(plan.release, TgiRelease) and not plan.release.sizes_pool
    if stated and total_tokens is None and stated_pool:
        assert plan is not None
        rows += stated_pool_rows(log, plan, stated)
        if failed:
            warnings.append(failed_pool_warning(plan, failed))
    else:
        rows.append(pool_row(log, predicted.get("max_batch_total_tokens")))
    rows += launch_rows(log, plan)
    if failed and total_tokens is None and not stated_pool:
        notes.append(
            f"the warmup ran out of memory holding a {failed[0]}-token pool with {failed[1]} prefill tokens "
            "(TGI 0.9.0-0.9.3 allocates the stated --max-batch-total-tokens): a plan's pool above it overstates what fits"
        )
    blocks = log.get("kv_blocks")
    if blocks:
        rows.append(
            Comparison("num_blocks", "blocks", predicted.get("num_gpu_blocks"), blocks[0], log.lines["kv_blocks"])
        )
    if log.get("no_automatic_total"):
        notes.append(
            "TGI could not size this model's KV pool (not a flash model): the total is its 16000-token default"
        )
    overhead = kv_actual = None
    if (
        plan is not None
        and isinstance(plan.capacity, TgiCapacity)
        and total_tokens
        and not log.get("no_automatic_total")
    ):
        kv_actual = total_tokens * plan.capacity.kv_bytes_per_token
        overhead = pool_overhead(plan, kv_actual)
        rows.append(
            Comparison(
                "kv_cache",
                "bytes",
                predicted.get("kv_cache"),
                kv_actual,
                f"{total_tokens} tokens x {plan.capacity.kv_bytes_per_token} B per token per shard",
            )
        )
        rows.append(
            Comparison(
                "overhead",
                "bytes",
                predicted.get("overhead"),
                overhead,
                "what the release's formula leaves besides the weights and the KV pool (warmup activation, CUDA context, non-torch)",
            )
        )
        estimated = predicted.get("overhead") or 0
        if overhead < 0 or (estimated and overhead > IMPLAUSIBLE_OVERHEAD * estimated):
            gpu = plan.inputs.gpu.id if plan.inputs.gpu else "the given device"
            warnings.append(
                f"a {format_bytes(kv_actual)} KV pool leaves {format_bytes(overhead)} of overhead on a {gpu} "
                f"(kvops estimates {format_bytes(estimated)}): the log ran on another GPU or with other flags; "
                "give the run's own --gpu and flags; the profile keeps no overhead"
            )
            overhead = None
    if plan is None:
        notes.append("no prediction: give --model and --gpu for the run to compare against the planner")
    release = plan.release if plan is not None else None
    profile = Profile(
        engine="tgi",
        source=source,
        model=log.args.get("model_id") or (plan.inputs.spec.name if plan else None),
        gpu=plan.inputs.gpu.id if plan and plan.inputs.gpu else None,
        engine_version=str(release.version) if isinstance(release, TgiRelease) else None,
        tp=log.args.get("num_shard") or (plan.inputs.tp if plan else None),
        max_num_batched_tokens=_stated(
            log, "max_batch_prefill_tokens", ("max_batch_prefill_tokens", "warmup_max_prefill_tokens")
        )[0],
        overhead_bytes=overhead if overhead is not None and overhead >= 0 else None,
        kv_cache_bytes=kv_actual,
        num_gpu_blocks=blocks[0] if blocks else None,
        block_size=blocks[1] if blocks else None,
    )
    return Calibration("tgi", source, rows, profile, notes, warnings)


def pool_row(log: TgiLog, predicted: int | None) -> Comparison:
    """The KV pool: the one the router set, else the one a 0.9.0-0.9.3 warmup tried (and failed) to allocate."""
    if log.get("max_batch_total_tokens") is not None:
        return Comparison(
            "max_batch_total_tokens",
            "tokens",
            predicted,
            log.get("max_batch_total_tokens"),
            log.lines["max_batch_total_tokens"],
        )
    failed = log.get("pool_out_of_memory")
    if failed:
        return Comparison("max_batch_total_tokens", "tokens", predicted, failed[0], log.lines["pool_out_of_memory"])
    return Comparison("max_batch_total_tokens", "tokens", predicted, log.args.get("max_batch_total_tokens"), "")


def stated_pool_rows(log: TgiLog, plan: Plan, stated: int) -> list[Comparison]:
    """0.9.0-0.9.3: the pool is the --max-batch-total-tokens the run stated (TGI allocates it as given, it sizes
    none), so the plan predicts that; what kvops says fits beside it is the room, which a failed run bounds."""
    room = plan.capacity.kv_tokens if isinstance(plan.capacity, TgiCapacity) else None
    failed = log.get("pool_out_of_memory") is not None
    source = log.lines["pool_out_of_memory"] if failed else f"the launcher's Args: max_batch_total_tokens: {stated}"
    held = f"the run could not hold {stated}" if failed else f"the run held {stated}"
    return [
        Comparison("max_batch_total_tokens", "tokens", stated, stated, source),
        Comparison(
            "kv_room_tokens",
            "tokens",
            room,
            None,
            f"the tokens kvops says fit beside the weights and the warmup; {held}",
        ),
    ]


def failed_pool_warning(plan: Plan, failed: tuple[int, int]) -> str:
    """What a 0.9.0-0.9.3 pool that did not fit says of the plan's memory terms."""
    capacity, release = plan.capacity, plan.release
    assert isinstance(capacity, TgiCapacity) and isinstance(release, TgiRelease)
    stated, prefill_tokens = failed
    blocks = -(-stated // capacity.block_size) + budget.LEGACY_EXTRA_BLOCKS
    held = blocks * capacity.block_size * capacity.kv_bytes_per_token
    missing = plan.kv_cache_bytes - held
    terms = {term.name: term.bytes for term in plan.memory}
    named = ", ".join(
        f"{name} {format_bytes(terms[name])}" for name in ("weights", "activation", "non_torch") if name in terms
    )
    return (
        f"{release.label} allocates the stated {stated}-token pool ({blocks:,} blocks of {capacity.block_size}, "
        f"{format_bytes(held)} a shard) before its warmup prefill, and they did not fit (its {prefill_tokens} "
        "prefill tokens are the requests' next tokens: the prefill's forward had run); kvops leaves room for "
        f"{capacity.kv_tokens:,} tokens ({format_bytes(plan.kv_cache_bytes)}) beside {named} of a "
        f"{format_bytes(terms['budget'])} budget: its terms miss at least {format_bytes(missing)} a shard on this "
        f"launch, which {release.label}'s warmup (flash_causal_lm.py) does not explain, or the GPUs held other "
        f"memory; keep --max-batch-total-tokens below {stated} here until a run that starts calibrates it"
    )


def launch_rows(log: TgiLog, plan: Plan | None) -> list[Comparison]:
    """The prefill budget and the context the launch ran with (its args, the launcher's defaults, the router's
    warmup call), against the plan's."""
    capacity = plan.capacity if plan is not None and isinstance(plan.capacity, TgiCapacity) else None
    rows = []
    for term, names, planned in (
        (
            "max_batch_prefill_tokens",
            ("max_batch_prefill_tokens", "warmup_max_prefill_tokens"),
            capacity.max_batch_prefill_tokens if capacity else None,
        ),
        (
            "max_total_tokens",
            ("launcher_max_total_tokens", "max_total_tokens", "warmup_max_total_tokens"),
            capacity.max_model_len if capacity else None,
        ),
    ):
        actual, source = _stated(log, term, names)
        if actual is not None:
            rows.append(Comparison(term, "tokens", planned, actual, source))
    return rows


def _stated(log: TgiLog, arg: str, names: tuple[str, ...]) -> tuple[int | None, str]:
    """A launch figure from the `Args` dump, else the first log line that states it."""
    if log.args.get(arg) is not None:
        return log.args[arg], f"the launcher's Args: {arg}: {log.args[arg]}"
    for name in names:
        if log.get(name) is not None:
            return log.get(name), log.lines[name]
    return None, ""


def pool_overhead(plan: Plan, kv_bytes: int) -> int:
    """What the plan's release formula says the warmup took besides the weights, for a pool of `kv_bytes`."""
    release = plan.release
    assert isinstance(release, TgiRelease)
    total = next(term.bytes for term in plan.memory if term.name == "total")
    weights = next(term.bytes for term in plan.memory if term.name == "weights")
    fraction = plan.inputs.memory_fraction or budget.DEFAULT_CUDA_MEMORY_FRACTION
    return budget.overhead_from_pool(release, total, fraction, weights, kv_bytes)


def observation(log: TgiLog, plan: Plan, source: str) -> Observation | None:
    """The overhead the run's pool implies, beside kvops' model of the warmup prefill; None without a sized pool."""
    total_tokens = log.get("max_batch_total_tokens")
    capacity, release = plan.capacity, plan.release
    if not total_tokens or log.get("no_automatic_total") or not isinstance(capacity, TgiCapacity):
        return None
    assert isinstance(release, TgiRelease)
    model, _ = budget.activation_model(plan.inputs, release, capacity.max_batch_prefill_tokens)
    budget_term = next(term.bytes for term in plan.memory if term.name == "budget")
    return Observation(
        source,
        release.family,
        plan.inputs.tp,
        model,
        overhead=pool_overhead(plan, total_tokens * capacity.kv_bytes_per_token),
        budget=budget_term,
        gpu=plan.inputs.gpu.id if plan.inputs.gpu else None,
    )
