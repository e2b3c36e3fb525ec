"""The overheads (activation peak, non-torch memory, CUDA graphs, the margin) fitted on the corpus of public engine
logs, per release family: offline, in tests and `python bench/accuracy.py --refit`; the fit kvops ships is read by
kvops.overheads."""

from __future__ import annotations

from dataclasses import replace
from math import ceil

from kvops.overheads import MIN_MARGIN_LOGS, POOLED, FamilyFit, Observation, OverheadFit
from kvops.units import GiB

MiB = 1 << 20


# The fit itself (offline: tests and `python bench/accuracy.py --refit`); the values it makes, and the one kvops ships,
# are in kvops.overheads.
OVERHEAD_QUANTILE = 0.9  # the planned KV is below what this share of the family's logs got
MIN_FAMILY_LOGS = 3  # fewer logs than this and a family plans with the fit of the family it falls back to
MIN_SAMPLER_LOGS = 2  # logs whose profile peaked in the sampler, to fit a family's bytes per logit
SAMPLER_PEAK_SHARE = 0.8  # a log whose forward model is below this share of its activation peaked in the sampler


def fit_overheads(
    engine: str,
    observations: list[Observation],
    families: tuple[str, ...],
    fallbacks: dict[str, str] | None = None,
    graph_families: tuple[str, ...] = (),
    sampler_fallbacks: dict[str, str] | None = None,
    non_torch_prior: tuple[int, int] | None = None,
) -> OverheadFit:
    """Each family's terms from its logs; a family with too few plans with the one it falls back to (the nearest
    release that shares its engine and memory profile), else with the pooled fit. The sampler's bytes per logit
    fall back apart, to the nearest family whose profile samples the same way (`sampler_fallbacks`: a sorting
    sampler borrows a sorting one's). A family in `graph_families` (its release takes the CUDA-graph estimate from
    the KV budget) with too few logs of its own borrows its fallback's logs that print that estimate, as if it had
    been applied: the same arithmetic, so its margin and band carry the estimate's spread. Families are fitted after
    the ones they fall back to. The margin and the spread come from every log's leave-one-out residual (each
    predicted by its family's fit without it): the family's own when it has enough, else pooled over the families.
    Logs whose budget arithmetic cannot be the launch's are left out, and listed. `non_torch_prior` (tp 1, tp >= 2)
    is the engine's non-torch memory where no log of that tp measures it (else kvops' V0-log priors below)."""
    fallbacks = fallbacks or {}
    sampler_fallbacks = sampler_fallbacks or {}
    excluded = tuple(sorted((item.source, why) for item in observations if (why := item.implausible)))
    kept = [item for item in observations if item.implausible is None]
    pooled = _fit_terms(POOLED, kept, None, prior=non_torch_prior)
    groups = {family: [item for item in kept if item.family == family] for family in families}
    borrowed: dict[str, str] = {}
    for family in graph_families:
        own, fallback = groups.get(family, []), fallbacks.get(family)
        if len(own) < MIN_FAMILY_LOGS and fallback:
            borrowed[family] = fallback
            groups[family] = own + [
                replace(item, family=family, cuda_graphs_applied=True)
                for item in groups.get(fallback, [])
                if item.cuda_graphs and item.activation is not None and item.non_torch is not None
            ]
    fits: dict[str, FamilyFit] = {POOLED: pooled}

    def base(family: str) -> FamilyFit:
        fallback = fallbacks.get(family)
        if fallback is None:
            return pooled
        return fits.get(fallback) or base(fallback)

    def sampler_base(family: str) -> FamilyFit | None:
        fallback = sampler_fallbacks.get(family)
        return fits.get(fallback) if fallback else None

    order = sorted(families, key=lambda name: (_depth(name, fallbacks), _depth(name, sampler_fallbacks)))
    for family in order:
        if len(groups[family]) >= MIN_FAMILY_LOGS:
            fitted = _fit_terms(family, groups[family], base(family), sampler_base(family))
            fits[family] = replace(fitted, borrowed=borrowed.get(family, ""))
    residuals = {family: _residuals(own, base(family), sampler_base(family)) for family, own in groups.items()}
    every = [value for own in residuals.values() for value in own]
    for name, fit in list(fits.items()):
        family_residuals = residuals.get(name, [])
        chosen = family_residuals if len(family_residuals) >= MIN_MARGIN_LOGS else every
        if chosen:
            margin = max(0, _quantile(chosen, OVERHEAD_QUANTILE))
            spread = (max(0, max(chosen) - margin), max(0, margin - min(chosen)))
            fits[name] = replace(fit, margin=margin, spread=spread, residuals=len(chosen))
    ordered = {name: fits[name] for name in (POOLED, *families) if name in fits}
    return OverheadFit(
        engine,
        ordered,
        tuple(sorted(item.source for item in kept)),
        excluded,
        tuple(sorted(fallbacks.items())),
        tuple(sorted(sampler_fallbacks.items())),
    )


def _depth(family: str, fallbacks: dict[str, str]) -> int:
    """How many families this one falls back through (fitted after them)."""
    return 0 if family not in fallbacks else 1 + _depth(fallbacks[family], fallbacks)


def _residuals(observations: list[Observation], base: FamilyFit, sampler: FamilyFit | None = None) -> list[int]:
    """Each log's total overhead less what its family's fit without it predicts (positive: kvops said too little)."""
    out = []
    for index, held in enumerate(observations):
        if held.total is None:
            continue
        rest = observations[:index] + observations[index + 1 :]
        if len(rest) >= MIN_FAMILY_LOGS:
            fit = _fit_terms(held.family, rest, base, sampler)
        else:
            fit = replace(base, sampler_bytes_per_logit=sampler.sampler_bytes_per_logit) if sampler else base
        out.append(held.total - fit.total(held))
    return out


def _fit_terms(
    family: str,
    observations: list[Observation],
    base: FamilyFit | None,
    sampler_base: FamilyFit | None = None,
    prior: tuple[int, int] | None = None,
) -> FamilyFit:
    non_torch_all = [item.non_torch for item in observations if item.non_torch is not None]
    default_non_torch = base.non_torch if base else (prior or (NON_TORCH_TP1, NON_TORCH_TP))

    def non_torch(multi: bool, default: int) -> int:
        found = [
            item.non_torch
            for item in observations
            if item.non_torch is not None and (item.tp > 1) == multi and (not multi or item.custom_all_reduce)
        ]
        return _median(found) if found else (_median(non_torch_all) if non_torch_all else default)

    nt = (non_torch(False, default_non_torch[0]), non_torch(True, default_non_torch[1]))
    without = [
        item.non_torch
        for item in observations
        if item.non_torch is not None and item.tp > 1 and not item.custom_all_reduce
    ]
    nccl = _median(without) if without else (base.non_torch_nccl if base else None)
    default_graphs = base.cuda_graphs if base else (0, 0)

    def graphs(multi: bool, default: int) -> int:
        found = [item.default_graphs for item in observations if item.default_graphs and (item.tp > 1) == multi]
        every = [item.default_graphs for item in observations if item.default_graphs]
        return _median(found) if found else (_median(every) if every else default)

    cuda_graphs = (graphs(False, default_graphs[0]), graphs(True, default_graphs[1]))
    peaks = [
        (item, peak) for item in observations if (peak := _activation_seen(item, nt, cuda_graphs, nccl)) is not None
    ]
    per_logit = [
        (peak - item.persistent) / item.logits
        for item, peak in peaks
        if item.logits and item.forward < SAMPLER_PEAK_SHARE * peak
    ]
    if len(per_logit) >= MIN_SAMPLER_LOGS:
        import statistics

        bytes_per_logit = statistics.median(per_logit)
    else:
        borrowed = sampler_base or base
        bytes_per_logit = borrowed.sampler_bytes_per_logit if borrowed else 0.0
    sampler = FamilyFit(family, 0, bytes_per_logit, nt, cuda_graphs, 0, (0, 0), 0, non_torch_nccl=nccl)
    excess = [peak - sampler.activation(item.forward, item.logits, item.persistent) for item, peak in peaks]
    extra = _excess(excess) if excess else (base.activation_excess if base else 0)
    return replace(sampler, activation_excess=extra, logs=len(observations))


def _activation_seen(
    item: Observation, non_torch: tuple[int, int], cuda_graphs: tuple[int, int], nccl: int | None = None
) -> int | None:
    """The activation peak a log measured, or read from its overhead sum less the fitted non-torch and graphs."""
    if item.activation is not None:
        return item.activation
    if item.overhead is None:
        return None
    fitted = round(cuda_graphs[0 if item.tp == 1 else 1] * item.graph_share)
    graphs = (item.cuda_graphs or fitted) if item.cuda_graphs_applied else 0
    spent = (
        non_torch[0] if item.tp == 1 else (nccl if not item.custom_all_reduce and nccl is not None else non_torch[1])
    )
    return item.overhead - spent - graphs


def _excess(excess: list[int]) -> int:
    """The excess a fit plans with: the median of its logs' excesses over kvops' model; on fewer logs than a family
    needs of its own (MIN_FAMILY_LOGS) the largest, and never below zero. One or two logs say nothing of where the
    next launch lands among them, and a negative excess (kvops' model above what a log took) is not credited back on
    so little: the plan errs toward less KV. (TGI's fit rests on two logs, a 2.4 A100 launch at -0.32 GiB and a 3.0.1
    RTX 3090 AWQ launch at +0.15 GiB: their median, -0.08 GiB, promised the 3.0.1 launch 0.2 GiB more KV than it got
    wherever it was predicted without its own log.)"""
    if len(excess) >= MIN_FAMILY_LOGS:
        return _median(excess)
    return max(0, *excess)


def _median(values: list[int]) -> int:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2


def _quantile(values: list[int], share: float) -> int:
    """Nearest-rank quantile: the smallest value at least `share` of the values are at or below."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, ceil(share * len(ordered)) - 1))]


# Before any log: non-torch memory of one process (CUDA/cuBLAS workspaces, attention buffers) and, at tp >= 2, NCCL
# and custom all-reduce buffers too: 0.35 GiB (RTX 3090, tp 1, vllm-project/vllm#10517) to 0.20 GiB per rank
# (RTX 3090, vllm-project/vllm PR #14447) in V0 logs.
NON_TORCH_TP1 = 512 * MiB
NON_TORCH_TP = 1 * GiB
