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

    merged = options.under(engine.stated_options(log, config))
    plan, why = None, None
    if merged.model:
        try:
            plan = predict(merged.plan_inputs())
        except KvopsError as exc:
            why = f"no prediction for this run: {exc}"
    return engine.calibrate(log, config, plan, source), why
