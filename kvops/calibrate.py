"""Calibration: one engine run predicted from the options it states, and compared, term by term, by its engine.

The types a calibration is made of are in `kvops.calibration`; each engine's `calibrate.py` compares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvops.deployment import DeploymentOptions
from kvops.errors import KvopsError

if TYPE_CHECKING:
    from kvops.calibration import Calibration
    from kvops.engines.base import Engine


def calibrate_run(
    engine: Engine, log: Any, config: Any, options: DeploymentOptions, source: str
) -> tuple[Calibration, str | None]:
    """Calibrate one run: predict it from the options it states (the user's own options win), compare.

    Returns the calibration, and why there is no prediction when the run could not be planned."""
    from kvops.planner import predict

    stated = engine.stated_options(log, config)
    merged = options.under(stated)
    plan, why = None, None
    if merged.model:
        try:
            plan = predict(merged.plan_inputs())
        except KvopsError as exc:
            why = f"no prediction for this run: {exc}"
    calibration = engine.calibrate(log, config, plan, source)
    if plan is not None and stated.model and _another_model(plan.inputs.spec.name, stated.model):
        calibration.warnings.append(
            f"the run loaded {stated.model}, the prediction is for --model {plan.inputs.spec.name}: the differences "
            "below are the two models', not the plan's error; leave --model out to predict the run's own"
        )
    return calibration, why


def _another_model(planned: str, loaded: str) -> bool:
    """Two Hub ids of two models (a local path says nothing of which model it holds)."""
    from kvops.model.refs import parse_ref, same_model

    return parse_ref(planned) is not None and parse_ref(loaded) is not None and not same_model(loaded, planned)
