"""`kvops explain`: where a vLLM engine's GPU memory went, what its KV cache holds now, and the one next action.

Figures come first from what the engine reported (its startup log, `vllm:cache_config_info` and
`vllm:kv_cache_usage_perc` on a live /metrics), then from nvidia-smi (device total and used), and only for terms
the engine did not report from the planner (`kvops.planner`), each marked with where it came from. A failed run is
read from its own error: which term ran out, with the figures the message states. The next action is the planner's
first way out that fits (`kvops.planner.ways_out`), re-planned on the engine's real KV pool; where the planner cannot
reproduce the failure, the engine's own advice, with its numbers. Pure: parsed inputs in, an `Explanation` out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvops.errors import KvopsError
from kvops.explain.actions import Action, next_action
from kvops.explain.failures import Diagnosis, diagnose
from kvops.explain.kv_now import KvNow, kv_now
from kvops.explain.memory import LOG_ROUNDING, Figure, device_total, inconsistent, memory_figures
from kvops.explain.run import TERM_LABELS, Run, planned_capacity
from kvops.plan import Plan, PlanInputs
from kvops.planner import predict
from kvops.policy import Level, Limits, Policy

__all__ = ["TERM_LABELS", "Action", "Diagnosis", "Explanation", "Figure", "KvNow", "Run", "device_total", "explain"]


@dataclass
class Explanation:
    sources: list[str]
    device: str
    version: str | None
    state: str  # serving | started | failed | unknown
    figures: list[Figure]
    kv: KvNow | None
    level: Level | None
    limits: Limits | None
    diagnosis: Diagnosis | None
    action: Action
    notes: list[str] = field(default_factory=list)

    def figure(self, name: str) -> Figure | None:
        return next((item for item in self.figures if item.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": "vllm",
            "sources": self.sources,
            "device": self.device,
            "version": self.version,
            "state": self.state,
            "memory": {item.name: item.to_dict() for item in self.figures},
            "kv": self.kv.to_dict() if self.kv else None,
            "level": self.level.label if self.level is not None else None,
            "limits": self.limits.to_dict() if self.limits else None,
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis else None,
            "action": self.action.to_dict(),
            "notes": self.notes,
        }


def explain(run: Run, inputs: PlanInputs | None, policy: Policy, notes: list[str] | None = None) -> Explanation:
    notes = list(notes or [])
    predicted = _predict(inputs, notes)
    figures = memory_figures(run, predicted, inputs)
    kv = kv_now(run, predicted, policy)
    level = policy.raw_level(kv.usage) if kv else None
    diagnosis = diagnose(run.failure, run, figures, predicted)
    action = next_action(run, inputs, kv, level, diagnosis, figures, notes, planned_capacity(predicted))
    sizing = run.log.sizing() if run.log else None
    if sizing:
        notes.append(sizing)
    if any(item.basis in ("reported", "derived") for item in figures) and run.log:
        notes.append(f"figures read from the log are rounded: {LOG_ROUNDING}")
    notes += inconsistent(figures)
    if inputs is None and (diagnosis or level not in (None, Level.OK)):
        notes.append("give --model (and --gpu) for the planner's estimates of unreported terms and its ways out")
    sources = [source for source in (run.log_source, run.metrics_source, run.smi_source) if source]
    return Explanation(
        sources,
        run.device,
        run.facts.get("version"),
        _state(run),
        figures,
        kv,
        level,
        policy.limits(level) if level is not None else None,
        diagnosis,
        action,
        notes,
    )


def _predict(inputs: PlanInputs | None, notes: list[str]) -> Plan | None:
    if inputs is None:
        return None
    try:
        return predict(inputs)
    except KvopsError as exc:
        notes.append(f"no plan for this run: {exc}")
        return None


def _state(run: Run) -> str:
    if run.failure:
        return "failed"
    if run.reading is not None:
        return "serving"
    if any(
        run.facts.get(fact) is not None
        for fact in ("kv_cache_size_tokens", "num_gpu_blocks", "cudagraph_captured_bytes", "consumed_bytes")
    ):
        return "started"
    return "unknown"
