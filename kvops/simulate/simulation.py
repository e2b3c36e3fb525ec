"""One deployment's traffic simulated: arms side by side on the same trace, the highest rate that meets an SLO, and
the replicas a target rate needs. The engine's adapter builds its scheduler; the step time prices each batch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from math import ceil
from typing import Any

from kvops import engines
from kvops.errors import KvopsError
from kvops.frozen import frozen
from kvops.plan import Plan
from kvops.policy import Policy
from kvops.simulate import degrade
from kvops.simulate.prompts import prompt_tokens
from kvops.simulate.results import Slo, Summary, summarize
from kvops.simulate.run import ClientSettings, RunLog, run_trace
from kvops.simulate.steptime import StepTime
from kvops.simulate.trace import Trace

Progress = Callable[[str, int, int], None]  # (what, done, total)
RATE_TOLERANCE = 0.03  # the max-rate search stops when the bracket is this narrow (relative)
MAX_SEARCH_RUNS = 12


@frozen
class Setup:
    """What every run of one simulation shares."""

    plan: Plan
    trace: Trace
    step_time: StepTime
    clients: ClientSettings
    slo: Slo
    scheduler_flags: Mapping[str, Any]  # the engine's scheduler flags beside the plan (policy, watermark, ...)
    policy: Policy | None = None  # the degrade policy of `ARM+degrade` arms (None: none is run)


@frozen
class ArmResult:
    arm: str
    change: str  # what the arm adds to the stock command
    label: str  # the scheduler that ran
    summary: Summary
    log: RunLog
    settings: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "change": self.change,
            "scheduler": self.label,
            "engine_settings": dict(self.settings),
            **self.summary.to_dict(),
        }


def run_arm(setup: Setup, arm: str, trace: Trace | None = None, progress: Progress | None = None) -> ArmResult:
    """`trace` (default: the setup's) through the engine's scheduler as `arm` runs it; `ARM+degrade` runs ARM behind
    the setup's degrade policy at the API server."""
    trace = trace or setup.trace
    engine = engines.get(setup.plan.engine)
    scheduler_arm, degraded = degrade.split_arm(arm)
    core, change, settings = engine.simulation_core(setup.plan, scheduler_arm, setup.scheduler_flags)
    door = None
    if degraded:
        if setup.policy is None:
            raise KvopsError(f"--compare {arm}: no degrade policy was given to run")
        door = degrade.door(setup.policy)
        change = " ".join(part for part in (change, f"--middleware {engine.admission_middleware}") if part)
        # what the API server in front ran: the middleware and the policy as it levels each request
        settings = {
            **settings,
            "middleware": engine.admission_middleware,
            "degrade_policy": setup.policy.for_admission().to_dict(),
        }
    step_time = setup.step_time.with_graphs(
        settings.get("cuda_graph_sizes", ()), settings.get("cuda_decode_graph_sizes", ())
    )
    total = len(trace.requests)

    def step_seconds(batch) -> float:
        return step_time.seconds(batch.new_tokens, batch.context, sum(batch.samples))

    report = (lambda done: progress(arm, done, total)) if progress else None
    log = run_trace(
        core,
        trace,
        step_seconds,
        max_model_len=settings["max_model_len"],
        api_s=step_time.coefficients.api_s.value,
        input_s=step_time.coefficients.input_seconds,
        clients=setup.clients,
        prompt=prompt_tokens,
        progress=report,
        door=door,
    )
    return ArmResult(arm, change, core.label, summarize(log, setup.slo), log, settings)


def compare(setup: Setup, arms: list[str], progress: Progress | None = None) -> list[ArmResult]:
    """Each arm on the same trace, in the order given."""
    return [run_arm(setup, arm, progress=progress) for arm in arms]


# --- capacity questions -------------------------------------------------------------------------------------------


@frozen
class RatePoint:
    rate_rps: float
    attainment: float
    goodput_rps: float
    summary: Summary

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate_rps": round(self.rate_rps, 4),
            "requests": self.summary.requests,
            "slo_attainment": round(self.attainment, 4),
            "goodput_rps": round(self.goodput_rps, 4),
            "ttft_p99_ms": round(self.summary.ttft.p99 * 1000, 3),
            "tpot_p99_ms": round(self.summary.tpot.p99 * 1000, 3),
            "preemptions": self.summary.preemptions,
        }


@frozen
class RateSearch:
    """The highest request rate one replica serves at the SLO attainment asked (0 when even the lowest tried
    misses), and every rate tried."""

    arm: str
    attainment: float
    max_rate_rps: float
    saturation_rps: float  # completed requests per second with every request sent at once
    points: tuple[RatePoint, ...]
    twice_over: RatePoint | None = None  # the trace followed by itself again, at the max rate

    @property
    def sustained(self) -> bool:
        """Whether the max rate held for twice the trace: a rate a short trace meets only while its queue builds
        is no rate a replica sustains."""
        return self.twice_over is None or self.twice_over.attainment >= self.attainment

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "slo_attainment_target": self.attainment,
            "max_rate_rps": round(self.max_rate_rps, 4),
            "saturation_rps": round(self.saturation_rps, 4),
            "points": [point.to_dict() for point in sorted(self.points, key=lambda point: point.rate_rps)],
            "twice_over": self.twice_over.to_dict() if self.twice_over else None,
            "sustained": self.sustained,
        }


def at_rate(trace: Trace, rate: float) -> Trace:
    """The trace's requests at `rate` per second: its arrival gaps scaled (their burstiness kept), to the arrivals
    `--rate rate` replays (drawn arrivals: as drawn at that rate)."""
    if not trace.timed or not trace.requests:
        raise KvopsError("a rate needs a timed trace")
    own = trace.nominal_rate
    if own is None:
        raise KvopsError("the trace's requests all arrive at once: it has no rate to scale")
    return trace.scaled(rate / own)


def twice_over(trace: Trace) -> Trace:
    """The trace followed by itself again, one mean gap after its last arrival: the same traffic for twice as long
    (the copies' prompts are their own: `prompt_tokens` keys a request's tokens by its index)."""
    requests = trace.requests
    rate = trace.rate
    shift = requests[-1].arrival_s - requests[0].arrival_s + (1 / rate if rate else 0.0)
    again = tuple(replace(request, arrival_s=request.arrival_s + shift) for request in requests)
    return replace(trace, requests=requests + again, drawn_rate=None)


def all_at_once(trace: Trace) -> Trace:
    return replace(trace, requests=tuple(replace(request, arrival_s=0.0) for request in trace.requests))


def max_rate(setup: Setup, arm: str, attainment: float, progress: Progress | None = None) -> RateSearch:
    """Bisect the request rate (the trace's gaps scaled) for the highest at which `attainment` of the requests
    meet the SLO. The bracket starts at the throughput with every request sent at once, and doubles while its top
    still meets the SLO: a finite trace sent at a rate can do better than all at once, whose last requests run in a
    batch too small to fill the GPU."""
    at_once = run_arm(setup, arm, all_at_once(setup.trace), progress).summary
    if at_once.attainment >= attainment:
        raise KvopsError(
            f"--max-rate: all {len(setup.trace.requests)} requests sent at once meet {attainment:.0%} of the SLO: at "
            "any rate they do, the trace is too short to load one replica; give more requests"
        )
    saturated = at_once.throughput_rps
    points: list[RatePoint] = []

    def probe(rate: float) -> bool:
        result = run_arm(setup, arm, at_rate(setup.trace, rate), progress).summary
        points.append(RatePoint(rate, result.attainment, result.goodput_rps, result))
        return result.attainment >= attainment

    low, high = 0.0, saturated
    while probe(high) and len(points) < MAX_SEARCH_RUNS:  # ends: far above saturation, the requests come at once
        low, high = high, 2 * high
    candidate = (low + high) / 2 if low else saturated / 2
    while len(points) < MAX_SEARCH_RUNS and (low == 0.0 or (high - low) / high > RATE_TOLERANCE):
        if probe(candidate):
            low = candidate
        else:
            high = candidate
        candidate = (low + high) / 2 if low else high / 2
        if not low and high < saturated / 64:
            break
    return RateSearch(arm, attainment, low, saturated, tuple(points), _twice_over(setup, arm, low, progress))


def _twice_over(setup: Setup, arm: str, rate: float, progress: Progress | None) -> RatePoint | None:
    """The trace twice over at `rate`: a finite trace sent at a rate it cannot sustain meets the SLO while its queue
    builds, and more of the same traffic at that rate does not."""
    return _sustained_point(setup, arm, rate, progress) if rate > 0 else None


@frozen
class Replicas:
    """The fewest replicas, each taking an equal share of `target_rps`, at which the trace twice over meets the SLO
    attainment at each one's share (`per_replica`); `fewer` is the same check one replica fewer, which missed (None:
    one replica)."""

    target_rps: float
    replicas: int
    per_replica: RatePoint
    search: RateSearch
    fewer: RatePoint | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target_rps": self.target_rps,
            "replicas": self.replicas,
            "per_replica": self.per_replica.to_dict(),
            "one_fewer": self.fewer.to_dict() if self.fewer else None,
            "max_rate_per_replica": self.search.to_dict(),
        }


def replicas_for(
    setup: Setup, arm: str, target_rps: float, attainment: float, progress: Progress | None = None
) -> Replicas:
    """The fewest replicas, each taking an equal share of `target_rps` of this traffic, whose share meets the SLO
    attainment for the trace twice over (as the max rate's check: a share met only while a short trace's queue
    builds is not sustained). It starts at the count the max rate implies, bisects up from there where that count
    misses, and checks one replica fewer, so the answer is the smallest count that meets it."""
    search = max_rate(setup, arm, attainment, progress)
    if search.max_rate_rps <= 0:
        raise KvopsError(
            f"no rate of this traffic meets {attainment:.0%} of the SLO on one replica: no number of replicas will"
        )
    checked: dict[int, RatePoint] = {}

    def meets(count: int) -> bool:
        if len(checked) >= MAX_SEARCH_RUNS:
            raise KvopsError(
                f"--replicas: {MAX_SEARCH_RUNS} replica counts up to {max(checked)} tried, none met {attainment:.0%} "
                "of the SLO for the trace twice over; give more requests (--requests) or a looser SLO"
            )
        checked[count] = _sustained_point(setup, arm, target_rps / count, progress)
        return checked[count].attainment >= attainment

    missing, meeting = 0, max(1, ceil(target_rps / search.max_rate_rps))  # missing: the most known to miss
    while not meets(meeting):
        missing, meeting = meeting, max(meeting + 1, ceil(meeting * 1.5))
    while meeting - missing > 1:
        middle = (missing + meeting) // 2 if missing else meeting - 1
        if meets(middle):
            meeting = middle
        else:
            missing = middle
    return Replicas(target_rps, meeting, checked[meeting], search, checked.get(meeting - 1))


def _sustained_point(setup: Setup, arm: str, rate: float, progress: Progress | None) -> RatePoint:
    """The trace twice over at `rate`."""
    result = run_arm(setup, arm, twice_over(at_rate(setup.trace, rate)), progress).summary
    return RatePoint(rate, result.attainment, result.goodput_rps, result)
