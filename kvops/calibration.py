"""Calibration as a value: what an engine run reported against what the planner predicted, term by term.

Each engine's `calibrate.py` pairs what its run reported (its startup log, its live metrics) with the plan's figures
and turns the measurements into a `Profile` that `kvops plan --profile` uses in place of its estimates; the types
they share are here (`kvops.calibrate` runs a calibration). No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvops.frozen import frozen
from kvops.plan import Plan
from kvops.profile import Profile


@frozen
class Comparison:
    term: str
    unit: str  # "bytes", "tokens", "blocks", "x"
    predicted: float | None
    actual: float | None
    source: str  # the log line or metric it was read from

    @property
    def difference(self) -> float | None:
        if self.predicted is None or self.actual is None:
            return None
        return self.actual - self.predicted

    def to_dict(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "unit": self.unit,
            "predicted": self.predicted,
            "actual": self.actual,
            "difference": self.difference,
            "source": self.source,
        }


@dataclass
class Calibration:
    engine: str
    source: str
    rows: list[Comparison]
    profile: Profile
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the run does not match the deployment it is compared with

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "source": self.source,
            "comparisons": [row.to_dict() for row in self.rows],
            "profile": self.profile.to_dict(),
            "notes": self.notes,
            "warnings": self.warnings,
        }


def predicted_figures(plan: Plan | None) -> dict[str, Any]:
    """What the plan predicts for each figure a run reports, by the figure's name."""
    if plan is None:
        return {}
    terms = {term.name: term.bytes for term in plan.memory}
    cap = plan.capacity.to_dict() if plan.capacity else {}
    predicted: dict[str, Any] = {
        "weights": terms.get("weights"),
        "activation": terms.get("activation"),
        "non_torch": terms.get("non_torch"),
        "cuda_graphs": terms.get("cuda_graphs"),
        "startup_used": terms.get("startup_used"),
        "kv_cache": plan.kv_cache_bytes,
        "num_gpu_blocks": cap.get("num_blocks"),
        "kv_cache_size_tokens": cap.get("kv_cache_size_tokens"),
        "max_concurrency": cap.get("max_concurrency"),
        "max_batch_total_tokens": cap.get("max_batch_total_tokens"),
    }
    kv_term = plan.term("kv_cache")
    if kv_term is not None and kv_term.basis == "computed":  # the KV is what a budget leaves after the overheads
        predicted["overhead"] = sum(terms.get(name, 0) for name in ("activation", "non_torch", "cuda_graphs"))
    return predicted
