"""Fit a GPU's step-time scale where the gpu profile's efficiencies do not carry to it through its datasheet, score
it leave-one-out, and write it into kvops/catalog/step_time.json (the gpu profile's `gpu_scales`).

    python bench/fit_gpu_scale.py [--gpu A100-80GB] [--window 100] [--dry-run]

The gpu profile is fitted on H100 runs (bench/fit_steptime.py) and prices another GPU through its datasheet
figures. On sim-to-real's A100-80GB runs that priced every run too fast (their TPOT 1.19-1.35 x the simulated):
the H100's efficiencies are not the A100's (vLLM runs FlashAttention 3 on Hopper and 2 on Ampere,
vllm/v1/attention/backends/fa_utils.py `get_flash_attn_version`, besides other kernels and hosts). With four runs
kvops fits one factor on every term there, no more. The runs publish their GPU, engine flags and measurements but
not their workload: each is sent the profile every published run of its workload name used, as
bench/simulate_accuracy.py sends them (sim_experiments.assumed_experiments). Not fitted on: the queue-dominated
runs (scored apart by bench/simulate_accuracy.py).

Each run is simulated at a grid of scales (the first --window seconds of each stage, whole-run figures as
bench/simulate_accuracy.py scores them); the scale fitted on a set of runs is where the mean of log(simulated /
measured mean E2E) over them crosses 0, interpolated on the grid. Leave-one-out: each run simulated at the scale
fitted on the others. The scale fitted on all of them is written with those figures in its source, and each run's
leave-one-out scale (`leave_one_out`), which bench/simulate_accuracy.py scores that run with. A refit of the gpu
profile (bench/fit_steptime.py) drops the scales: they are relative to the profile.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from datetime import date

import numpy as np
from fit_steptime import at_scale, plannable, simulate_stage, update_step_time
from sim_experiments import Experiment, assumed_experiments, cited
from simulate_accuracy import METRICS, Scored, errors, whole_run

from kvops.simulate import steptime

GRID = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
TARGET = "e2e_mean_ms"


def predicted_at(experiment: Experiment, profile: steptime.Coefficients, window_s: float) -> dict[str, float]:
    runs = [simulate_stage(experiment, index, profile, window_s) for index in range(len(experiment.stages))]
    return whole_run(experiment, runs)


def log_errors(runs: list[Experiment], profile, gpu: str, window_s: float) -> dict[str, np.ndarray]:
    """Each run's log(simulated / measured mean E2E) at each scale of GRID."""
    found = {}
    for experiment in runs:
        row = []
        for scale in GRID:
            predicted = predicted_at(experiment, at_scale(profile, gpu, scale, "grid"), window_s)
            row.append(np.log(predicted[TARGET] / experiment.measured[TARGET]))
        found[experiment.id] = np.array(row)
        print(f"  {experiment.short}: " + ", ".join(f"x{s:g} {100 * np.expm1(e):+.1f}%" for s, e in zip(GRID, row)))
    return found


def fitted_scale(grid_errors: dict[str, np.ndarray], ids: list[str]) -> float:
    """Where the runs' mean log error crosses 0 on the grid (it rises with the scale), linearly between points."""
    mean = np.mean([grid_errors[run] for run in ids], axis=0)
    if mean[0] >= 0 or mean[-1] <= 0:
        raise SystemExit(f"the runs' fitted scale lies outside {GRID[0]}-{GRID[-1]}: widen GRID")
    return float(np.interp(0.0, mean, GRID))


def leave_one_out(
    runs: list[Experiment], grid_errors: dict[str, np.ndarray], profile, gpu: str, window_s: float
) -> tuple[dict[str, float], list[Scored]]:
    scales, scored = {}, []
    for experiment in runs:
        scale = round(fitted_scale(grid_errors, [run.id for run in runs if run.id != experiment.id]), 4)
        predicted = predicted_at(experiment, at_scale(profile, gpu, scale, "leave-one-out"), window_s)
        scales[experiment.id] = scale  # as written, so that bench/simulate_accuracy.py reproduces these figures
        scored.append(Scored(experiment, predicted, errors(predicted, experiment.measured)))
        shown = ", ".join(f"{metric} {signed(predicted, experiment, metric)}" for metric in scored[-1].errors)
        print(f"  {experiment.short} at x{scale:.3f}: {shown}", flush=True)
    return scales, scored


def signed(predicted: dict[str, float], experiment: Experiment, metric: str) -> str:
    return f"{100 * (predicted[metric] / experiment.measured[metric] - 1):+.1f}%"


def medians(scored: list[Scored]) -> str:
    return ", ".join(
        f"{metric.removesuffix('_ms')} {100 * statistics.median(item.errors[metric] for item in scored):.1f}%"
        for metric in METRICS
        if all(metric in item.errors for item in scored)
    )


def source(gpu: str, runs: list[Experiment], scored: list[Scored], grid_errors: dict[str, np.ndarray]) -> str:
    ids, models = cited(runs)
    each = ", ".join(signed(item.predicted, item.experiment, TARGET) for item in scored)
    alone = ", ".join(f"{100 * np.expm1(grid_errors[run.id][GRID.index(1.0)]):+.1f}%" for run in runs)
    return (
        f"fitted: bench/fit_gpu_scale.py on inference-sim's {gpu} runs {ids} (vLLM 0.15.1; {models}), their "
        f"workload assumed from its name, {date.today().isoformat()}; leave-one-out median absolute error "
        f"{medians(scored)} (mean E2E per run {each}; on the datasheet alone {alone})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="A100-80GB", help="the GPU whose runs are fitted (default A100-80GB)")
    parser.add_argument("--window", type=float, default=100.0, help="seconds of each stage simulated (default 100)")
    parser.add_argument("--dry-run", action="store_true", help="print the fit, do not write it")
    options = parser.parse_args()
    gpu = options.gpu
    runs = [run for run in assumed_experiments() if run.gpu == gpu and not run.queued and plannable(run)]
    if len(runs) < 2:
        raise SystemExit(f"--gpu {gpu}: {len(runs)} steady run(s) of it in bench/data/sim_to_real.json, 2 needed")
    profile = replace(steptime.coefficients("gpu"), gpu_scales={})
    print(f"{len(runs)} {gpu} runs at scales {', '.join(map(str, GRID))} (simulated / measured mean E2E):", flush=True)
    grid_errors = log_errors(runs, profile, gpu, options.window)
    print("leave-one-out:", flush=True)
    scales, scored = leave_one_out(runs, grid_errors, profile, gpu, options.window)
    print(f"median absolute error, leave-one-out: {medians(scored)}")
    scale = fitted_scale(grid_errors, [run.id for run in runs])
    print(f"{gpu}: x{scale:.4f}, fitted on all {len(runs)}")
    if not options.dry_run:
        entry = {"value": round(scale, 4), "source": source(gpu, runs, scored, grid_errors), "leave_one_out": scales}
        update_step_time(
            f"the gpu profile's scale on {gpu}",
            lambda profiles: profiles["gpu"].setdefault("gpu_scales", {}).update({gpu: entry}),
        )


if __name__ == "__main__":
    main()
