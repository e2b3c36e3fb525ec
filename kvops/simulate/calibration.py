"""The step time fitted to the user's own GPU: a `vllm bench serve` result replayed through the same scheduler, and
the step time scaled until the simulated clients see the time between tokens the real ones measured.

One figure is fitted: a factor on every step-time coefficient (the terms keep their shares of a step, so a GPU
that runs the model slower or faster than its datasheet says is priced by what it really did), found by fixed-point
iteration on the mean TPOT: the step time scales, the schedule is simulated again, until the simulated mean TPOT is
the measured one within 0.2%. TPOT is the time between tokens, which neither the API server's time nor the queue
before a request's first token enters, so it measures the GPU alone.

The request times are the benchmark's own (when each was sent), so the schedule is the one the engine saw, and
each request's length is what it generated. What one run cannot tell apart stays as shipped: the split between the
terms (prefill against decode, attention against weights), the API server's time (`api_s`) and the hand-off to the
engine core (`input_s`). Fitting the API server's time to the run's mean TTFT as well was tried and scored worse on
the runs it was not fitted on (bench/simulate_calibration.py --fit-api: it carries that run's queue and prefill
into every request). The report gives the mean and p90 of TTFT, TPOT and E2E before and after, so a fit that one
factor cannot carry shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import date
from typing import Any

from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.simulate.measured import Figures, Measured
from kvops.simulate.results import Summary
from kvops.simulate.simulation import Progress, Setup, run_arm
from kvops.simulate.steptime import Coefficient, Coefficients, StepTime

TOLERANCE = 0.002  # the simulated mean TPOT within 0.2% of the measured one
MAX_ROUNDS = 12


@frozen
class Calibration:
    source: str  # the benchmark result
    scale: float
    rounds: int
    base: Coefficients
    coefficients: Coefficients
    measured: Figures
    before: Figures  # simulated with the base coefficients
    after: Figures  # simulated with the calibrated ones (the last round's run)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "step_time_scale": round(self.scale, 6),
            "rounds": self.rounds,
            "measured": self.measured.to_dict(),
            "simulated_before": self.before.to_dict(),
            "simulated_after": self.after.to_dict(),
            "profile": self.profile(),
        }

    def profile(self) -> dict[str, Any]:
        """The calibrated coefficients as `--step-time FILE` reads them."""
        found = self.coefficients.to_dict()
        if self.coefficients.hardware is not None:
            found["hardware"] = asdict(self.coefficients.hardware)
        return found


def calibrate(setup: Setup, measured: Measured, progress: Progress | None = None) -> Calibration:
    """Scale the setup's step time until the simulated mean TPOT is the measured one; the setup's trace must be
    the benchmark's (`measured.trace`)."""
    figures = measured.figures()
    if figures.tpot.mean <= 0:
        raise UsageError(
            f"{measured.trace.source}: no request generated two tokens or more: no TPOT to fit the step time on"
        )
    base = setup.step_time.coefficients
    why = f"calibrated on {measured.trace.source} ({date.today().isoformat()})"
    runs: dict[float, Summary] = {}

    def tpot_at(scale: float) -> float:
        what = "calibration: as shipped" if scale == 1 else f"calibration round {len(runs)}"
        runs[scale] = _run(setup, scaled(base, scale, why), what, progress)
        return runs[scale].tpot.mean

    scale, _, rounds = fit_scale(tpot_at, figures.tpot.mean)
    return Calibration(
        measured.trace.source,
        scale,
        rounds,
        base,
        scaled(base, scale, why),
        figures,
        Figures.of(runs[1.0]),
        Figures.of(runs[scale]),
    )


def fit_scale(tpot_at: Callable[[float], float], target: float) -> tuple[float, float, int]:
    """The factor on every step-time coefficient at which `tpot_at(factor)`, a simulated mean TPOT, is `target`:
    fixed-point iteration from 1 (the schedule moves with the step time, so TPOT is not quite proportional to it).
    Returns the factor, the mean TPOT there and the rounds it took."""
    scale, tpot, rounds = 1.0, tpot_at(1.0), 0
    while tpot > 0 and abs(tpot / target - 1) > TOLERANCE and rounds < MAX_ROUNDS:
        scale *= target / tpot
        rounds += 1
        tpot = tpot_at(scale)
    return scale, tpot, rounds


def scaled(base: Coefficients, scale: float, why: str) -> Coefficients:
    """`base` with every term's coefficient times `scale`; `why` says where the factor came from."""
    terms = {
        name: Coefficient(term.value * scale, f"{term.value:.6g} x {scale:.4f}, {why}")
        for name, term in base.terms.items()
    }
    return replace(
        base,
        name=f"{base.name}, calibrated",
        terms=terms,
        fitted_on=f"profile {base.name} ({base.fitted_on}) x {scale:.4f}, {why}",
        held_out=(),  # fitted on the user's own run now: the public runs' verdict is the base profile's
        fitted_gpus=(),
    )


def _run(setup: Setup, coefficients: Coefficients, what: str, progress: Progress | None) -> Summary:
    step_time = StepTime(setup.step_time.cost, setup.step_time.hardware, coefficients)
    report = (lambda _arm, done, total: progress(what, done, total)) if progress else None
    return run_arm(replace(setup, step_time=step_time), "stock", progress=report).summary
