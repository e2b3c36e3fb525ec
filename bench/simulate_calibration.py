"""`kvops simulate --calibrate` scored on workloads it was not calibrated on: one benchmark run of a deployment
calibrates the step time (kvops/simulate/calibration.py: one factor on every coefficient, from the run's mean TPOT),
which then predicts the deployment's other runs.

    python bench/simulate_calibration.py [--window 100] [--bases shipped,physics] [--fit-api]

The runs: bench/data/sim_to_real.json's (inference-perf against vLLM 0.15.1 on H100-80GB), grouped by deployment
(model and tp); a deployment with two runs or more (other workloads: other prompt and output lengths, other rates)
gives each run in turn as the calibration and scores the rest. Two starting points:
  shipped  the shipped GPU fit, which saw every one of these runs (calibration can only fix what it left)
  physics  no fit at all: every coefficient at the physical prior bench/fit_steptime.py pulls toward (the datasheet
           roofline with nominal efficiencies), as a GPU or model kvops was never fitted on starts
Printed per starting point: the median absolute error over the scored runs of E2E mean, TTFT mean and TPOT mean,
before calibration and after. Queue-dominated runs are left out, as the accuracy bench leaves them out of its fits.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from dataclasses import replace

import numpy as np
from fit_steptime import PRIORS, profile_from, simulate_stage
from sim_experiments import Experiment, experiments
from simulate_accuracy import errors, whole_run

from kvops.simulate import steptime
from kvops.simulate.calibration import fit_scale, scaled
from kvops.simulate.steptime import Coefficient, Coefficients

METRICS = ("e2e_mean_ms", "ttft_mean_ms", "tpot_mean_ms")


def predict(experiment: Experiment, profile: Coefficients, window_s: float) -> dict[str, float]:
    runs = [simulate_stage(experiment, index, profile, window_s) for index in range(len(experiment.stages))]
    return whole_run(experiment, runs)


def calibrated(
    experiment: Experiment, base: Coefficients, at_base: dict[str, float], window_s: float, fit_api: bool = False
) -> tuple[Coefficients, float]:
    """`base` calibrated on `experiment` as `kvops simulate --calibrate` calibrates it on a benchmark result, from
    its figures under `base` (`at_base`); with `fit_api`, the API server's time fitted to the run's mean TTFT too
    (the variant tried and not shipped)."""
    why = f"calibrated on {experiment.short}"
    figures: dict[float, dict[str, float]] = {1.0: at_base}

    def tpot_at(scale: float) -> float:
        if scale not in figures:
            figures[scale] = predict(experiment, scaled(base, scale, why), window_s)
        return figures[scale]["tpot_mean_ms"]

    scale, _, _ = fit_scale(tpot_at, experiment.measured["tpot_mean_ms"])
    if not fit_api:
        return scaled(base, scale, why), scale
    engine_ttft_s = figures[scale]["ttft_mean_ms"] / 1000 - base.api_s.value
    api_s = max(experiment.measured["ttft_mean_ms"] / 1000 - engine_ttft_s, 0.0)
    return replace(scaled(base, scale, why), api_s=Coefficient(api_s, why)), scale


def physics() -> Coefficients:
    """Every coefficient at its physical prior: no fit."""
    values = [PRIORS[name][0] for name in (*steptime.TERMS, "api_s")]
    return profile_from(np.array(values), "physical prior (bench/fit_steptime.py PRIORS)", "no fit: the priors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=100.0, help="seconds of each stage simulated (default 100)")
    parser.add_argument("--bases", default="shipped,physics", help="starting points: shipped, physics")
    parser.add_argument(
        "--fit-api", action="store_true", help="fit the API server's time to the run's mean TTFT too (not shipped)"
    )
    args = parser.parse_args()
    deployments: dict[tuple[str, int], list[Experiment]] = defaultdict(list)
    for experiment in experiments():
        if not experiment.queued:
            deployments[(experiment.model, experiment.tp)].append(experiment)
    groups = {key: runs for key, runs in deployments.items() if len(runs) > 1}
    for name in args.bases.split(","):
        base = steptime.coefficients("gpu") if name == "shipped" else physics()
        before: list[dict[str, float]] = []
        after: list[dict[str, float]] = []
        for (model, tp), runs in groups.items():
            plain = {run.id: predict(run, base, args.window) for run in runs}
            for calibration in runs:
                profile, scale = calibrated(calibration, base, plain[calibration.id], args.window, args.fit_api)
                for run in runs:
                    if run is calibration:
                        continue
                    before.append(errors(plain[run.id], run.measured))
                    after.append(errors(predict(run, profile, args.window), run.measured))
                    print(
                        f"  {name}: {model} tp {tp}: calibrated on {calibration.short} (x {scale:.3f}), {run.short}: "
                        + ", ".join(
                            f"{metric} {before[-1][metric]:.1%} -> {after[-1][metric]:.1%}" for metric in METRICS
                        )
                    )
        print(f"\n{name}: {len(after)} predictions of a run from another run of its deployment, median error")
        for metric in METRICS:
            print(
                f"  {metric:13s} before {statistics.median(row[metric] for row in before):6.1%}"
                f"   calibrated {statistics.median(row[metric] for row in after):6.1%}"
            )


if __name__ == "__main__":
    main()
