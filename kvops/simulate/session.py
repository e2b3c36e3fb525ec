"""One `kvops simulate` call: the deployment planned, the traffic built, the step time chosen, the runs made, and
everything they produced kept for the renderers."""

from __future__ import annotations

from dataclasses import field, replace
from typing import Any

from kvops import engines
from kvops.deployment import DeploymentOptions
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.model.refs import same_model
from kvops.plan import Plan, PlanError
from kvops.policy import load_policy
from kvops.simulate import cost, degrade, steptime
from kvops.simulate.calibration import Calibration, calibrate
from kvops.simulate.formats import detect_format, read_bench_result
from kvops.simulate.measured import Figures, Measured
from kvops.simulate.results import Slo, Spread, spread
from kvops.simulate.run import ClientSettings
from kvops.simulate.simulation import ArmResult, Progress, RateSearch, Replicas, Setup, compare, max_rate, replicas_for
from kvops.simulate.synthetic import check_max_tokens_mode
from kvops.simulate.trace import Trace
from kvops.simulate.traffic import Traffic, build_trace
from kvops.workload import p95_workload

SPARSE_ROUTING = 1 / 8  # experts per token over experts at or below which the low-concurrency caveat is said


@frozen
class Request:
    """What the user asked of the simulation, beside the deployment."""

    traffic: Traffic
    max_tokens: str = "trace"
    scheduler_flags: dict[str, Any] = field(default_factory=dict)
    step_time_file: str | None = None
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    arms: tuple[str, ...] = ("stock",)
    max_rate: bool = False
    target_rate: float | None = None
    attainment: float = 0.9
    tokenizer: str | None = None  # a local tokenizer folder for ShareGPT's texts
    policy_path: str | None = None  # the degrade policy of `ARM+degrade` arms (None: the shipped one)
    calibrate: str | None = None  # a `vllm bench serve` result to fit the step time to (its requests are the traffic)
    draws: int = 1  # draws of the traffic (seeds seed, seed + 1, ...): each figure's spread over them


@frozen
class Answer:
    setup: Setup
    arms: tuple[ArmResult, ...] = ()
    rate_search: RateSearch | None = None
    replicas: Replicas | None = None
    calibration: Calibration | None = None
    measured: Figures | None = None  # what the benchmark the trace came from measured (a vllm_bench trace)
    spreads: tuple[Spread, ...] = ()  # each arm over the draws of the traffic (--draws)
    one_draw: int | None = None  # the seed of synthetic traffic run on that seed alone (its figures are one draw)
    warnings: tuple[str, ...] = ()

    @property
    def plan(self) -> Plan:
        return self.setup.plan

    def to_dict(self) -> dict[str, Any]:
        setup, plan = self.setup, self.setup.plan
        capacity = plan.capacity
        return {
            "model": plan.inputs.spec.name,
            "gpu": plan.inputs.gpu.id if plan.inputs.gpu else None,
            "tp": plan.inputs.tp,
            "engine_version_planned": plan.release.label if plan.release else None,
            "pool": capacity.to_dict() if capacity else None,
            "command": plan.argv,
            "traffic": setup.trace.summary(),
            "clients": {
                "max_concurrency": setup.clients.max_concurrency,
                "max_tokens": setup.clients.max_tokens,
                "retries_after_refusal": setup.clients.retries,
            },
            "slo": setup.slo.to_dict(),
            "step_time": setup.step_time.to_dict(),
            "arms": [arm.to_dict() for arm in self.arms],
            "max_rate": self.rate_search.to_dict() if self.rate_search else None,
            "replicas": self.replicas.to_dict() if self.replicas else None,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "measured": self.measured.to_dict() if self.measured else None,
            "draws": [spread.to_dict() for spread in self.spreads] or None,
            "warnings": list(self.warnings),
        }


def prepare(request: Request, options: DeploymentOptions, trace: Trace | None = None) -> Setup:
    """The traffic built (or `trace`, given) and the deployment planned for it, with its step time: what every run
    shares."""
    split = [degrade.split_arm(arm) for arm in request.arms]
    engines.get(options.engine).simulation_arms([arm for arm, _ in split])  # fails at once where it cannot simulate
    policy = load_policy(request.policy_path) if any(degraded for _, degraded in split) else None
    trace = trace or build_trace(request.traffic, _tokenizer(request))
    plan = _plan(options, trace)
    return Setup(
        plan=plan,
        trace=trace,
        step_time=cost.step_time(plan, _coefficients(request, plan)),
        clients=ClientSettings(request.traffic.concurrency, request.max_tokens),
        slo=Slo(request.slo_ttft_s, request.slo_tpot_s),
        scheduler_flags=request.scheduler_flags,
        policy=policy,
    )


def run(request: Request, options: DeploymentOptions, progress: Progress | None = None) -> Answer:
    """Plan the deployment for this traffic, then run what was asked."""
    check_max_tokens_mode(request.max_tokens)
    measured = _measured(request)
    _check_draws(request)
    _check_rate_search(request)
    setup = prepare(request, options, measured.trace if measured else None)
    other_draws = _other_draws(request, setup.trace)
    warnings = _warnings(setup)
    if measured and measured.model and not same_model(measured.model, setup.plan.inputs.spec.name):
        warnings.append(
            f"the benchmark served {measured.model}, and this simulation plans {setup.plan.inputs.spec.name}: "
            "its figures are another model's unless that is the same checkpoint"
        )
    if request.calibrate and measured:
        return Answer(setup, calibration=calibrate(setup, measured, progress), warnings=tuple(warnings))
    trace = setup.trace
    if request.max_rate or request.target_rate is not None:
        if not trace.timed:
            raise UsageError(
                "--max-rate and --replicas scale the arrival rate: give timed traffic (--rate), not --concurrency"
            )
        arm = request.arms[0]
        if request.target_rate is not None:
            answer = replicas_for(setup, arm, request.target_rate, request.attainment, progress)
            warnings += _search_bounds(setup, answer.search, answer)
            return Answer(setup, replicas=answer, rate_search=answer.search, warnings=tuple(warnings))
        search = max_rate(setup, arm, request.attainment, progress)
        warnings += _search_bounds(setup, search, None)
        return Answer(setup, rate_search=search, warnings=tuple(warnings))
    arms = tuple(compare(setup, list(request.arms), progress))
    spreads = _spreads(setup, request, arms, other_draws, progress) if other_draws else ()
    synthetic = request.traffic.trace is None
    return Answer(
        setup,
        arms,
        measured=measured.figures() if measured else None,
        spreads=spreads,
        one_draw=request.traffic.seed if synthetic and not spreads else None,
        warnings=tuple(warnings),
    )


def _check_rate_search(request: Request) -> None:
    """--max-rate and --replicas raise the arrival rate until the SLO fails; --concurrency clients hold each request
    back until one of them is free, so the queue stays with them, unmeasured, and no rate overloads the engine. The
    search runs one arm: more arms in --compare would go unsearched."""
    searched = _given(("--max-rate", request.max_rate or None), ("--replicas", request.target_rate))
    if searched and len(request.arms) > 1:
        raise UsageError(
            f"{searched[0]} searches one arm, and --compare names {len(request.arms)} ({','.join(request.arms)}): give "
            "--compare ARM with one of them, and run once per arm to compare their rates"
        )
    if searched and request.traffic.concurrency is not None:
        raise UsageError(
            f"{searched[0]} searches the arrival rate, and --concurrency {request.traffic.concurrency} caps the "
            "requests in flight whatever the rate: leave out --concurrency (or the search, to replay at that many clients)"
        )


def _check_draws(request: Request) -> None:
    """--draws repeats one comparison: the rate search, the replicas and a calibration run once."""
    if request.draws < 2:
        return
    given = _given(
        ("--max-rate", request.max_rate or None),
        ("--replicas", request.target_rate),
        ("--calibrate", request.calibrate),
    )
    if given:
        raise UsageError(
            f"--draws repeats the runs of --compare over draws of the traffic; leave out {', '.join(given)}"
        )


def _other_draws(request: Request, first: Trace) -> list[tuple[int, Trace]]:
    """The traffic at seeds after --seed, one per further draw; a UsageError where the seed draws nothing (a trace
    replayed at its own times, or scaled to a rate)."""
    if request.draws < 2:
        return []
    seed = request.traffic.seed
    tokenizer = _tokenizer(request)
    draws = [
        (seed + offset, build_trace(replace(request.traffic, seed=seed + offset), tokenizer))
        for offset in range(1, request.draws)
    ]
    if draws[0][1].requests == first.requests:
        raise UsageError(
            "--draws: this traffic is the same at every seed (a trace replayed at its own or scaled times); "
            "draws need synthetic traffic or an untimed trace sent at --rate"
        )
    return draws


def _spreads(
    setup: Setup,
    request: Request,
    first: tuple[ArmResult, ...],
    draws: list[tuple[int, Trace]],
    progress: Progress | None,
) -> tuple[Spread, ...]:
    """Each arm's figures over the first draw and the others, on the same plan (the deployment does not change).
    Of the other draws only the summaries are kept: a run's log holds every request and every token gap."""
    summaries = [[arm.summary for arm in first]]
    for seed, trace in draws:
        labelled = _with_seed(progress, seed) if progress else None
        summaries.append([arm.summary for arm in compare(replace(setup, trace=trace), list(request.arms), labelled)])
    seeds = [request.traffic.seed] + [seed for seed, _ in draws]
    return tuple(spread(arm.arm, seeds, [each[position] for each in summaries]) for position, arm in enumerate(first))


def _with_seed(progress: Progress, seed: int) -> Progress:
    return lambda what, done, total: progress(f"{what}, seed {seed}", done, total)


def _measured(request: Request) -> Measured | None:
    """The benchmark result the traffic comes from, when it does: --calibrate's, or a --trace in vLLM's bench serve
    format replayed as it ran (not scaled to another rate, cut short or sent by other clients)."""
    if request.calibrate:
        _check_calibration(request)
        return read_bench_result(request.calibrate)
    traffic = request.traffic
    if traffic.trace is None or any(
        given is not None for given in (traffic.rate, traffic.requests, traffic.concurrency)
    ):
        return None
    if (traffic.trace_format or detect_format(traffic.trace)) != "vllm_bench":
        return None
    return read_bench_result(traffic.trace)


def _check_calibration(request: Request) -> None:
    """--calibrate replays the benchmark's own requests through stock vLLM: nothing else may shape the run."""
    traffic = request.traffic
    given = _given(
        ("--trace", traffic.trace),
        ("--rate", traffic.rate),
        ("--concurrency", traffic.concurrency),
        ("--requests", traffic.requests),
        ("--compare", request.arms != ("stock",) or None),
        ("--max-rate", request.max_rate or None),
        ("--replicas", request.target_rate),
    )
    if given:
        raise UsageError(
            f"--calibrate replays the benchmark's own requests through stock vLLM; leave out {', '.join(given)}"
        )


def _given(*options: tuple[str, Any]) -> list[str]:
    """The options of (name, value) pairs that were given (value not None), in order."""
    return [name for name, value in options if value is not None]


def _plan(options: DeploymentOptions, trace: Trace) -> Plan:
    """The deployment planned for this traffic: its requests at their p95 size the plan's own max-num-seqs; those
    longer than a --max-model-len given are left out (the engine refuses them)."""
    from kvops.planner import plan as make_plan

    limit = options.max_model_len if isinstance(options.max_model_len, int) else None
    fitting = [
        request for request in trace.requests if limit is None or request.prompt_tokens + request.output_tokens <= limit
    ]
    requests = fitting or trace.requests
    workload = p95_workload(
        [request.prompt_tokens for request in requests],
        [request.output_tokens for request in requests],
        f"{trace.source}, p95",
    )
    plan = make_plan(options.plan_inputs(workload))
    if plan.verdict is not None or plan.capacity is None:
        problem = plan.verdict.message() if plan.verdict else "the plan sized no KV pool"
        raise PlanError(f"{problem}; nothing to simulate (kvops plan with the same options shows the ways out)")
    return plan


def _coefficients(request: Request, plan: Plan) -> steptime.Coefficients:
    if request.step_time_file:
        from kvops.files import read_text

        return steptime.read_coefficients(read_text(request.step_time_file, "--step-time"), request.step_time_file)
    if plan.inputs.device == "cpu":
        return steptime.coefficients("cpu")
    return steptime.coefficients("gpu")


def _tokenizer(request: Request):
    """The tokenizer ShareGPT's texts are counted with (--tokenizer: a local tokenizer folder, kvops[hub])."""
    if request.tokenizer is None:
        return None
    try:
        from kvops.tokens import LocalTokenizer
    except ImportError:
        raise UsageError("--tokenizer needs kvops[hub]: pip install 'kvops[hub]'") from None
    local = LocalTokenizer(request.tokenizer)
    return lambda text: local.count(text, special_tokens=True)


def _latency_bounds(setup: Setup) -> set[str]:
    """Which way the step time's latencies may be off here, as the warnings say: "lower" where they are read as a
    lower bound (a GPU no public run scores, or held-out runs ran slower), "upper" where held-out runs ran faster."""
    step_time = setup.step_time
    coefficients = step_time.coefficients
    bounds = {"lower"} if coefficients.unscored(step_time.hardware.name) else set()
    for held in _held_out(setup):
        bounds |= {"lower"} if held.low > 1 else {"upper"} if held.high < 1 else set()
    return bounds


def _held_out(setup: Setup) -> list[steptime.HeldOut]:
    """The profile's figures on runs it was not fitted on that reach this deployment: its GPU, tp or experts."""
    step_time = setup.step_time
    where = (step_time.hardware.name, step_time.cost.tp, step_time.cost.num_experts)
    return [held for held in step_time.coefficients.held_out if held.applies(*where)]


def _search_bounds(setup: Setup, search: RateSearch, replicas: Replicas | None) -> list[str]:
    """What a bound on the latencies makes of the rate search's answers: latencies read as a lower bound make the
    max rate an upper bound and the replicas a lower bound, and the other way round."""
    found = _unsustained(search, replicas is not None)
    bounds = _latency_bounds(setup)
    if len(bounds) != 1 or search.max_rate_rps <= 0:
        return found
    low = bounds == {"lower"}
    rate = f"the max rate ({search.max_rate_rps:.3g} requests/s) as {'an upper' if low else 'a lower'} bound"
    count = f" and the replicas ({replicas.replicas}) as {'a lower' if low else 'an upper'} bound" if replicas else ""
    side = "lower" if low else "upper"
    return [*found, f"with latencies read as {'a' if low else 'an'} {side} bound, read {rate}{count}"]


def _unsustained(search: RateSearch, replicas_checked: bool) -> list[str]:
    """A max rate the trace meets only for its length: twice over at that rate, it misses the attainment. The
    replicas are checked twice over at their own share, so they are not read from it."""
    point = search.twice_over
    if search.sustained or point is None:
        return []
    requests = point.summary.requests
    read = (
        "the replicas were checked on the trace twice over at their share"
        if replicas_checked
        else "read the max rate as an upper bound and the replicas from it as a lower one, or give more requests "
        "(--requests)"
    )
    return [
        f"--max-rate: at {search.max_rate_rps:.3g} requests/s the trace twice over ({requests:,} requests back to "
        f"back) meets the SLO for {point.attainment:.0%} of requests, below {search.attainment:.0%}: "
        f"{requests // 2:,} requests end before that rate's queue settles, so a replica does not sustain it; {read}"
    ]


def _warnings(setup: Setup) -> list[str]:
    plan = setup.plan
    found = []
    spec = plan.inputs.spec
    step_time = setup.step_time
    coefficients = step_time.coefficients
    held = _held_out(setup)
    scored_experts = any(entry.experts_from for entry in held)  # runs of such models say more than the caveat
    if spec.num_experts and spec.experts_per_token / spec.num_experts <= SPARSE_ROUTING and not scored_experts:
        found.append(
            f"{spec.name} routes each token to {spec.experts_per_token} of {spec.num_experts} experts: the step time "
            "prices the experts a batch touches as if tokens chose them uniformly, and on the one such model it is "
            "scored on (Llama 4 Scout, 1 of 16, H100, vLLM 0.15.1) that predicted a fast decode where few "
            "requests run: vLLM's TPOT was 1.05 x the simulated at about 8 requests running, 1.12 x at 24 "
            "(2,500-token requests, KV offloaded to the CPU), within 5% at 26-61; read TPOT at a few requests "
            "running as a lower bound, or --calibrate on a benchmark of your own at that load"
        )
    if coefficients.unscored(step_time.hardware.name):
        others = sorted({held.gpu for held in coefficients.held_out if held.gpu} | set(coefficients.gpu_scales))
        priced = f", which priced the public runs on {', '.join(others)} too fast" if others else ""
        found.append(
            f"no public vLLM run on {step_time.hardware.name} scores the step time: it is the profile fitted on "
            f"{', '.join(coefficients.fitted_gpus)} through this GPU's datasheet alone{priced} "
            "(kvops/catalog/step_time.json); read its latencies as a lower bound, or --calibrate on a benchmark of "
            "your own"
        )
    for entry in held:
        read = "as a lower bound" if entry.low > 1 else "as an upper bound" if entry.high < 1 else "within that range"
        shown = entry.describe(scaled=entry.gpu in coefficients.gpu_scales)
        found.append(f"{shown}: read its latencies {read}, or --calibrate on a benchmark of your own")
    found += _priority_warnings(setup)
    longest = max((request.prompt_tokens for request in setup.trace.requests), default=0)
    if plan.capacity is not None and longest >= plan.capacity.max_model_len:
        found.append(
            f"requests with prompts of {plan.capacity.max_model_len:,} tokens or more are rejected, as vLLM rejects them (max-model-len {plan.capacity.max_model_len:,})"
        )
    return found


def _priority_warnings(setup: Setup) -> list[str]:
    """A trace's priorities order requests only under --scheduling-policy priority (vLLM's fcfs queue ignores them),
    and that policy orders a trace without priorities as fcfs does."""
    prioritized = sum(1 for request in setup.trace.requests if request.priority != 0)
    policy = setup.scheduler_flags.get("policy", "fcfs")
    if prioritized and policy != "priority":
        return [
            f"{prioritized:,} requests of the trace carry a priority, and --scheduling-policy {policy} serves them in "
            "arrival order: give --scheduling-policy priority to run them by priority"
        ]
    if not prioritized and policy == "priority":
        return [
            "--scheduling-policy priority: no request of this traffic carries a priority (every one is 0), so it orders "
            "them by arrival, as fcfs does"
        ]
    return []
