"""Fit kvops simulate's GPU step-time coefficients on public vLLM measurements, and write them to
kvops/catalog/step_time.json (profile "gpu").

    python bench/fit_steptime.py [--window 100] [--iterations 8] [--step 0.5] [--dry-run]

How: every experiment of bench/data/sim_to_real.json that publishes its workload (inference-perf on H100, vLLM
0.15.1) is simulated stage by stage through vLLM's own scheduler (the first --window seconds of each stage, the
whole of a stage of long requests, see sim_experiments.simulated_seconds; queue-dominated runs are left out of the
fit). With the schedule a run produced held fixed, the clock is linear in
the coefficients: a step ends at the start of its busy period plus the sum of the steps before it, each step's
time the coefficients times its roofline features (kvops/simulate/steptime.py). So each stage's mean TTFT, E2E
and TPOT are linear in the coefficients, and a bounded least squares on their relative errors, pulled weakly
toward physical priors, gives the coefficients. The schedules are then simulated again with them, each iteration
moving --step of the way to the solve's coefficients, until no coefficient moves more than SETTLED of its prior's
scale (or --iterations have run; each prints its largest move). The full step cycles between two schedules (on
2026-12-06 from the profile shipped then: kv 1.31, 1.17, 1.34), the half step settles in a few iterations, so the
defaults reproduce the shipped profile from itself. bench/simulate_accuracy.py scores the fit leave-one-out; the
profile it writes has no held-out figures until `bench/simulate_accuracy.py --write-held-out` scores it again, and
no GPU scales until bench/fit_gpu_scale.py fits them again.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date
from typing import Any

import numpy as np
from sim_experiments import REPO, Experiment, experiments, plan_for, request_weights, scheduler_flags, stage_trace

from kvops import engines
from kvops.simulate import cost, steptime
from kvops.simulate.prompts import prompt_tokens
from kvops.simulate.results import Slo, Summary, summarize
from kvops.simulate.run import RequestLog, RunLog, run_trace

PARAMETERS = (*steptime.TERMS, "api_s")
# priors: where an efficiency is not pinned by the data it stays near a physical value; (prior, scale, low, high)
PRIORS = {
    "step_s": (0.002, 0.002, 0.0, 0.05),
    "layer_s": (1e-5, 2e-5, 0.0, 1e-3),
    "tp_step_s": (0.002, 0.003, 0.0, 0.05),
    "linear": (1.25, 0.5, 1.0, 5.0),
    "experts": (1.3, 0.5, 1.0, 5.0),
    "compute": (0.2, 0.5, 0.0, 3.0),
    "kv": (1.3, 0.5, 1.0, 5.0),
    "attention": (2.0, 1.0, 1.0, 10.0),
    "comm": (1.5, 1.0, 1.0, 10.0),
    "comm_latency_s": (5e-6, 1e-5, 0.0, 1e-3),
    "expert_elements": (0.0, 0.5, 0.0, 5.0),
    "moe_layer_s": (0.0, 1e-4, 0.0, 1e-3),
    "api_s": (0.01, 0.01, 0.0, 0.2),
}
RIDGE = 0.05  # weight of the priors against one relative error
TRIM = 0.5  # a target predicted more than 50% off is left out of the solve (see solve)
SETTLED = 0.01  # a fit has settled when no coefficient moved more than this share of its prior's scale
TARGETS = ("ttft_mean_ms", "e2e_mean_ms", "tpot_mean_ms")
WEIGHTS = {"ttft_mean_ms": 0.5, "e2e_mean_ms": 1.0, "tpot_mean_ms": 1.0}
SLO = Slo(ttft_s=2.0, tpot_s=0.1)


@dataclass
class StageRun:
    """One stage simulated: its summary, and each target's mean as constant + row . parameters (ms)."""

    experiment: Experiment
    stage_index: int
    summary: Summary
    rows: dict[str, tuple[float, np.ndarray]]
    measured: dict[str, float]
    log: RunLog
    weights: list[float]  # of each of log.requests: how many of the real stage's requests it stands for


def coefficient_vector(profile: steptime.Coefficients) -> np.ndarray:
    return np.array([*profile.values(), profile.api_s.value])


def profile_from(vector: np.ndarray, source: str, fitted_on: str) -> steptime.Coefficients:
    terms = {name: steptime.Coefficient(float(value), source) for name, value in zip(steptime.TERMS, vector)}
    return steptime.Coefficients("gpu", terms, steptime.Coefficient(float(vector[-1]), source), fitted_on)


def recorded_run(plan, trace, profile: steptime.Coefficients, flags: dict) -> tuple[RunLog, np.ndarray]:
    """The trace through the plan's stock vLLM scheduler, each step priced by `profile`; with each step's term
    bases (TERMS order), which the fit linearizes around."""
    core, _, settings = engines.get("vllm").simulation_core(plan, "stock", flags)
    model = cost.step_time(plan, profile).with_graphs(settings["cuda_graph_sizes"])
    features: list[tuple[float, ...]] = []
    vector = coefficient_vector(profile)[:-1]

    def step_seconds(batch) -> float:
        values = model.features(batch.new_tokens, batch.context, sum(batch.samples))
        features.append(values)
        return sum(float(coefficient) * value for coefficient, value in zip(vector, values))

    log = run_trace(
        core,
        trace,
        step_seconds,
        max_model_len=settings["max_model_len"],
        api_s=profile.api_s.value,
        input_s=profile.input_seconds,
        prompt=prompt_tokens,
    )
    return log, np.array(features)


def simulate_stage(
    experiment: Experiment, stage_index: int, profile: steptime.Coefficients, window_s: float | None
) -> StageRun:
    """Run one stage and linearize its targets around the schedule it produced."""
    plan = plan_for(experiment)
    stage = experiment.stages[stage_index]
    trace = stage_trace(experiment, stage, window_s)
    log, features = recorded_run(plan, trace, profile, scheduler_flags(experiment, plan))
    weights = request_weights(experiment, stage, len(log.requests))
    rows = linear_rows(log, features, coefficient_vector(profile), weights)
    measured = {name: stage.measured[name] for name in TARGETS if stage.measured.get(name)}
    return StageRun(experiment, stage_index, summarize(log, SLO), rows, measured, log, weights)


def request_rows(log: RunLog, features: np.ndarray, vector: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each completed request's TTFT, E2E and TPOT as constant + row . parameters, in seconds, around this
    schedule: a request waits out the rest of the step running when it arrived (the same share of it, whatever
    the step costs), then every step up to its first token and its last; idle time before a step is constant.
    The requests are those of `completed_requests(log)`, in its order."""
    ends = np.asarray(log.timeline.time)
    starts = ends - features @ vector[:-1]
    cumulative = np.vstack((np.zeros(features.shape[1]), np.cumsum(features, axis=0)))  # row k: steps before k
    done = completed_requests(log)
    api = vector[-1]  # the clients see each step's tokens api_s after it ends
    sent = np.array([entry.sent for entry in done])
    first = np.searchsorted(ends, [entry.first_token - api - 1e-9 for entry in done])
    last = np.searchsorted(ends, [entry.finished - api - 1e-9 for entry in done])
    running = np.minimum(np.searchsorted(ends, sent, side="right"), len(ends) - 1)  # the step in progress, or next
    busy = starts[running] <= sent
    share = np.where(busy, (ends[running] - sent) / np.maximum(ends[running] - starts[running], 1e-12), 0.0)
    idle = np.where(busy, 0.0, starts[running] - sent)
    waited = share[:, None] * features[running] * busy[:, None]
    to_first = waited + cumulative[first + 1] - cumulative[running + 1]
    to_last = waited + cumulative[last + 1] - cumulative[running + 1]
    tokens = np.array([entry.tokens for entry in done], dtype=float)
    ones, zeros = np.ones((len(done), 1)), np.zeros((len(done), 1))
    without_running = np.where(busy[:, None], 0.0, features[running])  # an idle device starts with that step
    ttft = (idle, np.hstack((to_first + without_running, ones)))
    e2e = (idle, np.hstack((to_last + without_running, ones)))
    tpot = (
        np.zeros(len(done)),
        np.hstack(((cumulative[last + 1] - cumulative[first + 1]) / (tokens - 1)[:, None], zeros)),
    )
    return {"ttft": ttft, "e2e": e2e, "tpot": tpot}


def completed_requests(log: RunLog) -> list:
    """The requests a fit can price: those that completed with more than one token."""
    return [entry for entry in log.requests if priced(entry)]


def priced(entry: RequestLog) -> bool:
    return entry.finished >= 0 and entry.tokens > 1


def linear_rows(
    log: RunLog, features: np.ndarray, vector: np.ndarray, weights: list[float]
) -> dict[str, tuple[float, np.ndarray]]:
    """Each target's mean over the completed requests, each weighed by the real requests it stands for, as
    constant + row . parameters, in ms (request_rows)."""
    rows = request_rows(log, features, vector)
    share = normalized([weight for entry, weight in zip(log.requests, weights) if priced(entry)])
    return {
        f"{name}_mean_ms": (float(share @ constant * 1000), share @ row * 1000)
        for name, (constant, row) in rows.items()
    }


def normalized(weights: list[float]) -> np.ndarray:
    """Weights summing to 1 (equal ones where they sum to nothing)."""
    array = np.asarray(weights, dtype=float)
    total = array.sum()
    return array / total if total > 0 else np.full(len(array), 1.0 / max(len(array), 1))


def solve(runs: list[StageRun], around: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """Bounded least squares on the weighted relative errors of every run's targets, pulled toward the priors,
    each parameter solved for in units of its prior's scale. A target more than TRIM off at `around` is left
    out of this solve: near saturation a few percent of step time are seconds of queue, and one such stage
    would decide every coefficient (those stages are scored apart, bench/simulate_accuracy.py)."""
    from scipy.optimize import lsq_linear

    scales = np.array([PRIORS[name][1] for name in PARAMETERS])
    matrix, target = [], []
    for run in runs:
        for name, measured in run.measured.items():
            constant, row = run.rows[name]
            if abs((constant + row @ around) / measured - 1) > TRIM:
                continue
            weight = WEIGHTS[name] / measured
            matrix.append(row * scales * weight)
            target.append((measured - constant) * weight)
    for index, name in enumerate(PARAMETERS):
        row = np.zeros(len(PARAMETERS))
        row[index] = np.sqrt(ridge)
        matrix.append(row)
        target.append(np.sqrt(ridge) * PRIORS[name][0] / scales[index])
    lows = np.array([PRIORS[name][2] for name in PARAMETERS]) / scales
    highs = np.array([PRIORS[name][3] for name in PARAMETERS]) / scales
    solution = lsq_linear(np.array(matrix), np.array(target), bounds=(lows, highs), method="bvls")
    return np.asarray(solution.x) * scales


def fitted_experiments() -> list[Experiment]:
    """The experiments the fit uses: every one whose workload is published, but the queue-dominated."""
    return [experiment for experiment in experiments() if not experiment.queued and plannable(experiment)]


def plannable(experiment: Experiment) -> bool:
    from kvops.errors import KvopsError

    try:
        plan_for(experiment)
    except KvopsError as exc:
        print(f"  left out {experiment.short}: {exc}")
        return False
    return True


def simulate_all(chosen: list[Experiment], profile, window_s, log_progress=True) -> list[StageRun]:
    runs = []
    for experiment in chosen:
        for index in range(len(experiment.stages)):
            started = time.monotonic()
            runs.append(simulate_stage(experiment, index, profile, window_s))
            if log_progress:
                print(f"    {experiment.short} stage {index}: {time.monotonic() - started:.1f} s", flush=True)
    return runs


def fit(
    window_s: float | None, iterations: int, start: steptime.Coefficients, step: float = 0.5
) -> tuple[np.ndarray, list[StageRun], int | None]:
    """The coefficients, the last iteration's runs, and the iteration the fit settled at (None: it did not)."""
    chosen = fitted_experiments()
    vector = coefficient_vector(start)
    runs: list[StageRun] = []
    for iteration in range(iterations):
        print(f"iteration {iteration + 1}: simulating {len(chosen)} experiments", flush=True)
        runs = simulate_all(chosen, profile_from(vector, "iteration", ""), window_s)
        moved = vector + step * (solve(runs, vector) - vector)
        print("  " + ", ".join(f"{name} {value:.4g}" for name, value in zip(PARAMETERS, moved)), flush=True)
        print(f"  largest move: {largest_move(vector, moved)}", flush=True)
        settled = settled_between(vector, moved)
        vector = moved
        if settled:
            print(f"  settled: no coefficient moved more than {SETTLED:.0%} of its prior's scale", flush=True)
            return vector, runs, iteration + 1
    return vector, runs, None


def moves(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Each coefficient's move as a share of its prior's scale: the scale the solve works in, so that a coefficient
    near zero (tp_step_s) does not count a tiny move as a large share of itself."""
    return np.abs(after - before) / np.array([PRIORS[name][1] for name in PARAMETERS])


def settled_between(before: np.ndarray, after: np.ndarray) -> bool:
    return bool(np.all(moves(before, after) <= SETTLED))


def largest_move(before: np.ndarray, after: np.ndarray) -> str:
    """The coefficient that moved most in an iteration, as a share of its prior's scale (what SETTLED bounds)."""
    shares = moves(before, after)
    index = int(np.argmax(shares))
    return f"{PARAMETERS[index]} {100 * shares[index]:.2f}% of its prior's scale"


STEP_TIME = REPO / "kvops" / "catalog" / "step_time.json"


def update_step_time(what: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite kvops/catalog/step_time.json with `change` applied to its profiles, saying `what` was written."""
    data = json.loads(STEP_TIME.read_text())
    change(data["profiles"])
    STEP_TIME.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {what} to {STEP_TIME.relative_to(REPO)}")


def scales_without() -> dict[str, float]:
    """Each run a GPU's scale was fitted on (bench/fit_gpu_scale.py): the scale fitted without it."""
    scales = json.loads(STEP_TIME.read_text())["profiles"]["gpu"].get("gpu_scales", {})
    return {run: value for entry in scales.values() for run, value in entry.get("leave_one_out", {}).items()}


def at_scale(profile: steptime.Coefficients, gpu: str, scale: float, why: str) -> steptime.Coefficients:
    """`profile` with `gpu`'s steps `scale` times what its datasheet prices."""
    return replace(profile, gpu_scales={**profile.gpu_scales, gpu: steptime.Coefficient(scale, why)})


def write_profile(vector: np.ndarray, chosen: list[Experiment], window_s: float | None, how: str) -> None:
    models = sorted({experiment.model for experiment in chosen})
    fitted_on = (
        f"{len(chosen)} public vLLM 0.15.1 serving runs on H100-80GB (inference-perf, constant-rate stages, "
        "sent as it sends them: exponential gaps scaled to each stage's length; "
        f"bench/data/sim_to_real.json, models: {', '.join(models)}), first {window_s:g} s of each stage (whole where "
        "its requests are long: bench/sim_experiments.py simulated_seconds), its "
        "requests weighed as the whole stage's (the prefix cache's first cycle once), each step at the CUDA-graph "
        f"size vLLM pads it to, by bench/fit_steptime.py ({how}) on {date.today().isoformat()}; other GPUs through their datasheet figures (times their scale where "
        "bench/fit_gpu_scale.py fits one: gpu_scales)"
    )
    source = "fitted: bench/fit_steptime.py (see fitted_on)"
    profile = {
        "fitted_on": fitted_on,
        "fitted_gpus": sorted({experiment.gpu for experiment in chosen}),
        "terms": {
            name: {"value": float(f"{value:.6g}"), "source": source} for name, value in zip(steptime.TERMS, vector)
        },
        "api_s": {"value": float(f"{vector[-1]:.6g}"), "source": source},
    }
    update_step_time("the gpu profile", lambda profiles: profiles.update(gpu=profile))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=100.0, help="seconds of each stage simulated (default 100)")
    parser.add_argument("--iterations", type=int, default=8, help="at most this many, fewer once settled (default 8)")
    parser.add_argument(
        "--step", type=float, default=0.5, help="share of each iteration's move taken (default 0.5; 1 cycles)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the fit, do not write it")
    options = parser.parse_args()
    vector, runs, settled = fit(options.window, options.iterations, steptime.coefficients("gpu"), options.step)
    for run in runs:
        errors = []
        for name, measured in run.measured.items():
            constant, row = run.rows[name]
            errors.append(f"{name} {100 * ((constant + row @ vector) / measured - 1):+.1f}%")
        print(f"  {run.experiment.short} stage {run.stage_index}: {', '.join(errors)}")
    if settled is None:
        print(f"not settled after {options.iterations} iterations: the profile is where the last one left it")
    if not options.dry_run:
        how = f"steps of {options.step:g}, " + (f"settled at iteration {settled}" if settled else "not settled")
        write_profile(vector, fitted_experiments(), options.window, how)


if __name__ == "__main__":
    main()
