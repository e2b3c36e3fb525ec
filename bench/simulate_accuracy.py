"""kvops simulate against public GPU measurements of vLLM serving, leave-one-out, beside the other simulators.

    python bench/simulate_accuracy.py [--window 200] [--draws 1] [--no-queued] [--no-assumed] [--write-held-out]
                                      [--json OUT]

The measurements: bench/data/sim_to_real.json (inference-perf against vLLM 0.15.1 on H100-80GB, collected by the
inference-sim project; every experiment whose workload is published). Each experiment is predicted with step-time
coefficients fitted WITHOUT it (bench/fit_steptime.py's least squares on every other experiment's stages,
linearized around the schedules the shipped coefficients produce), then simulated stage by stage (the first
--window seconds of each, a stage of long requests whole: sim_experiments.simulated_seconds) through vLLM's own
scheduler. The figures are whole-run: each simulated request weighed
as the real stage's requests it stands for (sim_experiments.request_weights), the means and the p90 over all.
Queue-dominated runs (sim-to-real's overloaded and saturated ones: thousands of requests failed, or the queue grew
all run) are left out of every fit and scored apart with the shipped coefficients. The other simulators' figures
are sim-to-real's own runs of them on the same experiments (in the data file); the table counts each over the
experiments it predicted.

Held out entirely: the runs whose workload sim-to-real does not publish (only its name, beside the run's GPU,
engine flags and results), each sent the profile every published run of that name used
(sim_experiments.assumed_experiments), simulated with the shipped coefficients and scored apart, per GPU: A100
and L40S runs among them, and tp 8. The gpu profile is fitted on none of them; the A100's own scale
(bench/fit_gpu_scale.py) is fitted on its four, so each of those is simulated at the scale fitted on the other
three. --no-assumed skips them. --write-held-out writes, where
they reach a GPU or a tp no fitted run has, the range of their measured TPOT over the simulated into the gpu
profile (`held_out`), which `kvops simulate` warns with; a refit (bench/fit_steptime.py) drops it until then.

The send times are a random draw (sim_experiments.stage_trace: inference-perf's own are not published), and near
saturation one draw queues where another does not. --draws N scores each of N draws (seeds 0..N-1) apart, then
each experiment's median prediction over them: the figure a user gets from N runs of `kvops simulate --seed`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import date

import numpy as np
from fit_steptime import (
    PARAMETERS,
    StageRun,
    at_scale,
    coefficient_vector,
    normalized,
    plannable,
    profile_from,
    scales_without,
    simulate_all,
    simulate_stage,
    solve,
    update_step_time,
)
from sim_experiments import Experiment, assumed_experiments, cited, experiments

from kvops.simulate import results, steptime

METRICS = ("e2e_mean_ms", "e2e_p90_ms", "ttft_mean_ms", "tpot_mean_ms", "throughput_rps")
PEERS = (
    "blis-evolved",
    "blis-trained-physics-iter29-golden",
    "vidur",
    "aiconfigurator-estimate",
    "llm-optimizer-estimate",
    "blis-roofline",
)


@dataclass
class Scored:
    experiment: Experiment
    predicted: dict[str, float]
    errors: dict[str, float]  # metric -> |predicted / measured - 1|


def whole_run(experiment: Experiment, runs: list[StageRun]) -> dict[str, float]:
    """The stages' figures as one run: each simulated request weighed by the real requests it stands for
    (sim_experiments.request_weights: the stage's length, the prefix cache's first cycle once), the means and the
    p90 over all of them."""
    done = [
        (entry, weight)
        for run in runs
        for entry, weight in zip(run.log.requests, run.weights)
        if results.completed(entry)
    ]
    e2e = [(results.e2e(entry), weight) for entry, weight in done]
    ttft = [(results.ttft(entry), weight) for entry, weight in done]
    tpot = [(results.tpot(entry), weight) for entry, weight in done if entry.tokens > 1]
    # each window's requests stand for their whole stage's (the weights); the run ends when the last stage drains,
    # as inference-perf times it
    completed = sum(weight for _, weight in done)
    span = sum(stage.duration_s for stage in experiment.stages) + drain(runs[-1])
    return {
        "e2e_mean_ms": 1000 * weighted_mean(e2e),
        "e2e_p90_ms": 1000 * weighted_quantile(e2e, 0.9),
        "ttft_mean_ms": 1000 * weighted_mean(ttft),
        "tpot_mean_ms": 1000 * weighted_mean(tpot),
        "throughput_rps": completed / span,
    }


def weighted_mean(pairs: list[tuple[float, float]]) -> float:
    values, weights = np.array([value for value, _ in pairs]), normalized([weight for _, weight in pairs])
    return float(weights @ values) if pairs else 0.0


def weighted_quantile(pairs: list[tuple[float, float]], share: float) -> float:
    """The weighted nearest-rank quantile: the smallest value with at least `share` of the weight at or below it."""
    if not pairs:
        return 0.0
    ordered = sorted(pairs)
    cumulative = np.cumsum(normalized([weight for _, weight in ordered]))
    return ordered[min(int(np.searchsorted(cumulative, share - 1e-12)), len(ordered) - 1)][0]


def drain(run: StageRun) -> float:
    """Seconds from the stage's last request sent to its last answer."""
    requests = run.log.requests
    return max(entry.finished for entry in requests) - max(entry.sent for entry in requests)


def errors(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    return {
        metric: abs(predicted[metric] / measured[metric] - 1)
        for metric in METRICS
        if predicted.get(metric) is not None and measured.get(metric)
    }


def signed(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """Each metric's predicted / measured - 1: positive where the simulation is slower (or higher) than the run."""
    return {
        metric: predicted[metric] / measured[metric] - 1
        for metric in METRICS
        if predicted.get(metric) is not None and measured.get(metric)
    }


def signed_lines(per_draw: list[list[Scored]], scored: list[Scored]) -> list[str]:
    """Each experiment's signed errors on its median prediction, then on each draw (E2E, TTFT, TPOT means)."""
    lines = []
    for position, item in enumerate(scored):
        cells = []
        for metric in ("e2e_mean_ms", "ttft_mean_ms", "tpot_mean_ms"):
            each = [signed(draw[position].predicted, item.experiment.measured) for draw in per_draw]
            median = signed(item.predicted, item.experiment.measured)
            if metric not in median or any(metric not in errors for errors in each):
                continue
            draws = " ".join(f"{100 * errors[metric]:+.1f}" for errors in each)
            cells.append(f"{metric.removesuffix('_mean_ms')} {100 * median[metric]:+.1f}% [{draws}]")
        lines.append(f"  {item.experiment.short:<48} " + "  ".join(cells))
    return lines


def leave_one_out(chosen: list[Experiment], window_s: float) -> list[Scored]:
    shipped = steptime.coefficients("gpu")
    print(f"linearizing {len(chosen)} experiments around the shipped coefficients", flush=True)
    runs = simulate_all(chosen, shipped, window_s, log_progress=False)
    scored = []
    for experiment in chosen:
        others = [run for run in runs if run.experiment.id != experiment.id]
        vector = solve(others, coefficient_vector(shipped))
        profile = profile_from(vector, f"fitted without {experiment.short}", "leave-one-out")
        own = [simulate_stage(experiment, index, profile, window_s) for index in range(len(experiment.stages))]
        predicted = whole_run(experiment, own)
        scored.append(Scored(experiment, predicted, errors(predicted, experiment.measured)))
        shown = ", ".join(
            f"{metric} {100 * error:+.1f}%" for metric, error in signed(predicted, experiment.measured).items()
        )
        print(f"  {experiment.short}: {shown}", flush=True)
    return scored


def over_draws(per_draw: list[list[Scored]]) -> list[Scored]:
    """Each experiment's median prediction over the draws of send times, scored against its measurement."""
    scored = []
    for position, first in enumerate(per_draw[0]):
        each = [draw[position].predicted for draw in per_draw]
        predicted = {
            metric: statistics.median(values[metric] for values in each)
            for metric in METRICS
            if all(values.get(metric) is not None for values in each)
        }
        scored.append(Scored(first.experiment, predicted, errors(predicted, first.experiment.measured)))
    return scored


def shipped_scores(chosen: list[Experiment], window_s: float | None) -> list[Scored]:
    """Runs no fit saw, simulated with the shipped coefficients (window None: whole stages); a run its GPU's scale
    was fitted on (bench/fit_gpu_scale.py), at the scale fitted without it."""
    shipped = steptime.coefficients("gpu")
    without = scales_without()
    scored = []
    for experiment in chosen:
        profile = shipped
        if experiment.id in without:
            profile = at_scale(shipped, experiment.gpu, without[experiment.id], "fitted without this run")
        own = [simulate_stage(experiment, index, profile, window_s) for index in range(len(experiment.stages))]
        predicted = whole_run(experiment, own)
        scored.append(Scored(experiment, predicted, errors(predicted, experiment.measured)))
    return scored


def held_out_entries(assumed: list[Scored], fitted: list[Experiment]) -> list[dict]:
    """Where held-out runs reach what no fitted run has (another GPU, a larger tp), the range of their measured mean
    TPOT over the simulated: the profile's `held_out`, which `kvops simulate` warns with. Runs a GPU's scale was
    fitted on are simulated at the scale fitted without each (shipped_scores)."""
    gpus, tps = {item.gpu for item in fitted}, {item.tp for item in fitted}
    groups: dict[tuple[str, str | int], list[Scored]] = {}
    for item in assumed:
        run = item.experiment
        key = ("gpu", run.gpu) if run.gpu not in gpus else ("tp", run.tp) if run.tp not in tps else None
        if key and item.predicted.get("tpot_mean_ms"):
            groups.setdefault(key, []).append(item)
    entries = []
    for (field, value), items in sorted(groups.items(), key=lambda group: str(group[0])):
        ratios = [item.experiment.measured["tpot_mean_ms"] / item.predicted["tpot_mean_ms"] for item in items]
        ids, models = cited([item.experiment for item in items])
        entries.append(
            {
                field: value,
                "runs": len(items),
                "low": round(min(ratios), 2),
                "high": round(max(ratios), 2),
                "source": f"inference-sim's run{'s' if len(items) > 1 else ''} {ids} ({models}), their workload "
                f"assumed from its name; bench/simulate_accuracy.py, {date.today().isoformat()}",
            }
        )
    return entries


def keep_experts(profile: dict, entries: list[dict]) -> None:
    """The profile's held-out figures: `entries` beside the many-experts one bench/simulate_public_bench.py writes."""
    profile["held_out"] = entries + [held for held in profile.get("held_out", []) if "experts_from" in held]


def median_table(groups: dict[str, list[dict[str, float]]]) -> list[str]:
    """Median absolute percentage error per metric for each group of experiments' errors."""
    lines = [f"  {'':<44} {'n':>3} " + " ".join(f"{metric.removesuffix('_ms'):>14}" for metric in METRICS)]
    for name, rows in groups.items():
        cells = []
        for metric in METRICS:
            values = [row[metric] for row in rows if metric in row]
            cells.append(f"{100 * statistics.median(values):>13.1f}%" if values else f"{'-':>14}")
        lines.append(f"  {name:<44} {len(rows):>3} " + " ".join(cells))
    return lines


def peer_errors(scored: list[Scored]) -> dict[str, list[dict[str, float]]]:
    found: dict[str, list[dict[str, float]]] = defaultdict(list)
    for item in scored:
        for peer in PEERS:
            figures = item.experiment.peers.get(peer)
            if figures:
                normalised = {**figures}
                if "itl_mean_ms" in figures and "tpot_mean_ms" not in figures:
                    normalised["tpot_mean_ms"] = figures["itl_mean_ms"]
                found[peer].append(errors(normalised, item.experiment.measured))
    return found


def kinds(scored: list[Scored], suffix: str = "", everything: str = "all (H100, vLLM 0.15.1)") -> dict[str, list]:
    """The errors of all experiments, then per model kind and tensor parallelism."""
    groups: dict[str, list[dict[str, float]]] = {f"{everything}{suffix}": [item.errors for item in scored]}
    for kind in ("dense", "moe"):
        groups[f"model kind {kind}{suffix}"] = [item.errors for item in scored if item.experiment.kind == kind]
    groups[f"tp 1{suffix}"] = [item.errors for item in scored if item.experiment.tp == 1]
    groups[f"tp > 1{suffix}"] = [item.errors for item in scored if item.experiment.tp > 1]
    return groups


def gpus(scored: list[Scored]) -> dict[str, list[dict[str, float]]]:
    """The errors per GPU, then per model kind and tensor parallelism over all of them."""
    groups = {
        f"GPU {gpu}": [item.errors for item in scored if item.experiment.gpu == gpu]
        for gpu in sorted({item.experiment.gpu for item in scored})
    }
    return groups | kinds(scored, everything="all GPUs")


def report(per_draw: list[list[Scored]], scored: list[Scored], apart: list[Scored], assumed: list[Scored]) -> None:
    if len(per_draw) > 1:
        print("\nkvops simulate, leave-one-out, each draw of send times apart:")
        groups = {}
        for draw, each in enumerate(per_draw):
            groups |= kinds(each, f", draw {draw}")
        for line in median_table(groups):
            print(line)
        print(f"\nkvops simulate, leave-one-out, each experiment's median prediction over the {len(per_draw)} draws:")
    else:
        print("\nkvops simulate, leave-one-out (median absolute percentage error over experiments):")
    for line in median_table(kinds(scored)):
        print(line)
    print("\neach experiment, signed (simulated / measured - 1; + slow), its median prediction [each draw]:")
    for line in signed_lines(per_draw, scored):
        print(line)
    print("\nthe same experiments, other simulators (sim-to-real's runs of them; each over those it predicted):")
    for line in median_table(peer_errors(scored)):
        print(line)
    if assumed:
        print(
            "\nheld out, workload assumed: the runs that publish their GPU, engine flags and measurements but not their"
            "\nworkload, each sent the profile every published run of its workload name used; simulated with the"
            "\nshipped coefficients (other GPUs through their datasheets), each run a GPU's scale was fitted on at"
            "\nthe scale fitted on the others (bench/fit_gpu_scale.py, leave-one-out):"
        )
        for line in median_table(gpus(assumed)):
            print(line)
    if apart:
        print("\nqueue-dominated runs (overloaded or saturated; scored apart, shipped coefficients):")
        groups = {"published workload": [item.errors for item in apart if not item.experiment.assumed]}
        groups["workload assumed"] = [item.errors for item in apart if item.experiment.assumed]
        for line in median_table({name: rows for name, rows in groups.items() if rows}):
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=200.0, help="seconds of each stage simulated (default 200)")
    parser.add_argument("--json", help="write every experiment's figures to this file")
    parser.add_argument("--no-queued", action="store_true", help="skip the queue-dominated runs (slow)")
    parser.add_argument("--no-assumed", action="store_true", help="skip the runs whose workload is assumed")
    parser.add_argument(
        "--write-held-out", action="store_true", help="write where they reach another GPU or tp into the gpu profile"
    )
    parser.add_argument(
        "--draws", type=int, default=1, help="draws of send times, each scored, then their median (default 1)"
    )
    options = parser.parse_args()
    every = [experiment for experiment in experiments() if plannable(experiment)]
    held_out = [] if options.no_assumed else [item for item in assumed_experiments() if plannable(item)]
    per_draw, assumed_per_draw = [], []
    for draw in range(options.draws):
        if options.draws > 1:
            os.environ["KVOPS_BENCH_ARRIVALS"] = str(draw)
            print(f"draw {draw} of the send times", flush=True)
        per_draw.append(leave_one_out([experiment for experiment in every if not experiment.queued], options.window))
        assumed_per_draw.append(shipped_scores([item for item in held_out if not item.queued], options.window))
    scored = per_draw[0] if options.draws == 1 else over_draws(per_draw)
    assumed = assumed_per_draw[0] if options.draws == 1 else over_draws(assumed_per_draw)
    apart = [] if options.no_queued else shipped_scores([item for item in every + held_out if item.queued], None)
    report(per_draw, scored, apart, assumed)
    if options.write_held_out:
        entries = held_out_entries(assumed, every)
        update_step_time("the gpu profile's held-out figures", lambda profiles: keep_experts(profiles["gpu"], entries))
    print(f"\nfitted parameters: {', '.join(PARAMETERS)}; shipped: {coefficient_vector(steptime.coefficients('gpu'))}")
    if options.json:
        rows = [
            {
                "id": item.experiment.id,
                "assumed_workload": item.experiment.assumed,
                "predicted": item.predicted,
                "measured": item.experiment.measured,
                "errors": item.errors,
                **(
                    {"predicted_per_draw": [draw[position].predicted for draw in per_draw]}
                    if len(per_draw) > 1 and position < len(scored)
                    else {}
                ),
            }
            for position, item in enumerate([*scored, *assumed, *apart])
        ]
        with open(options.json, "w") as stream:
            json.dump(rows, stream, indent=1)


if __name__ == "__main__":
    main()
