"""The overheads kvops plans with when nothing was measured: each release family's terms, fitted on public logs.

What kvops plans when nothing was measured for a release family: the engine's own figures from public startup logs
(tests/fixtures/corpus), fitted by `kvops.engines.overhead_fit.fit_overheads` and shipped in kvops/catalog/overheads.json
(the test tests/unit/engines/test_overhead_fit.py refits the corpus and checks the file; `python bench/accuracy.py
--refit` writes it). Medians, so that one odd log does not move a family. Values only: `PlanInputs.overhead_fit`
holds one, each engine's budget reads it.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from functools import lru_cache
from math import ceil
from typing import Any

from kvops.frozen import frozen

OVERHEADS_FILE = "overheads.json"
IMPLAUSIBLE_OVERHEAD_SHARE = 0.25  # an overhead beyond this share of the budget is not the launch's
MIN_MARGIN_LOGS = 5  # fewer residuals than this bound nothing: no margin, no band (the plan says so)
POOLED = "all releases"  # the fit over every family, for a family without logs of its own or of its fallback


@frozen
class Observation:
    """What one engine log measured of the terms kvops estimates, beside kvops' own model of that launch."""

    source: str
    family: str
    tp: int
    forward: int  # kvops' model of the profile's forward-pass peak for this launch (bytes)
    logits: int = 0  # the logits the profile's sampler run holds at the fitted bytes per logit; 0 where none is
    # run or the runner sets their bytes (Model Runner V2: then in `persistent`)
    persistent: int = 0  # bytes kvops models as held through the sampler run (the fused-MoE workspace, MRv2's logits)
    activation: int | None = None
    non_torch: int | None = None
    cuda_graphs: int | None = None  # the engine's CUDA-graph estimate (taken from the KV budget when applied)
    cuda_graphs_applied: bool = False  # the release takes the CUDA-graph estimate from the KV budget
    graph_share: float = 1.0  # the run's capture sizes over the default ones the fitted estimate stands for
    overhead: int | None = None  # activation + non-torch + CUDA graphs, when the log gives only their sum
    budget: int = 0  # the memory the engine sized from (requested memory), for the plausibility check
    gpu: str | None = None
    custom_all_reduce: bool = True  # tp >= 2: vLLM's custom all-reduce ran (its buffers are non-torch memory)

    @property
    def implausible(self) -> str | None:
        """Why the overheads read from a log cannot be the launch's (the log ran with other flags, on another part,
        or the source's figures do not add up), or None."""
        total = self.total
        if total is None or not self.budget:
            return None
        if total < 0 or total > IMPLAUSIBLE_OVERHEAD_SHARE * self.budget:
            share = total / self.budget
            return f"its budget leaves {share:.0%} of the memory besides the weights and the KV cache: the stated launch does not match the log"
        return None

    @property
    def default_graphs(self) -> int | None:
        """The run's CUDA-graph estimate at the default capture sizes (the estimate grows with their number)."""
        return round(self.cuda_graphs / self.graph_share) if self.cuda_graphs else self.cuda_graphs

    @property
    def total(self) -> int | None:
        if self.overhead is not None:
            return self.overhead
        if self.activation is None or self.non_torch is None:
            return None
        return (
            self.activation
            + self.non_torch
            + (self.cuda_graphs if self.cuda_graphs_applied and self.cuda_graphs else 0)
        )

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@frozen
class FamilyFit:
    """One release family's fitted overhead terms, and how far its logs fell from them."""

    family: str
    activation_excess: int  # the engine's activation peak beyond kvops' model, median of the logs, bytes
    sampler_bytes_per_logit: float  # the sampler's peak per logit of the profile's decode step
    non_torch: tuple[int, int]  # bytes at tp 1, at tp >= 2
    cuda_graphs: tuple[
        int, int
    ]  # the engine's CUDA-graph estimate at tp 1, at tp >= 2 (taken from the KV budget where the release does)
    margin: int  # bytes planned on top of the fitted overheads: most logs got at least the KV left
    spread: tuple[int, int]  # how far below and above the planned KV the family's logs fell, bytes
    logs: int
    residuals: int = 0  # logs the margin and the spread rest on (each predicted without itself)
    borrowed: str = ""  # the family whose logs this one took, their CUDA-graph estimate applied ("" for its own)
    non_torch_nccl: int | None = None  # tp >= 2 without vLLM's custom all-reduce (None: as with it)

    @property
    def bounded(self) -> bool:
        """Enough logs to plan a margin and state a band; below that the plan says it cannot bound the estimate."""
        return self.residuals >= MIN_MARGIN_LOGS

    def sampler(self, logits: int) -> int:
        return ceil(logits * self.sampler_bytes_per_logit)

    def activation(self, forward: int, logits: int = 0, persistent: int = 0) -> int:
        """The profile's peak: the forward pass or the sampler (with what stays allocated through it), whichever is
        larger, plus the family's excess."""
        return max(0, max(forward, self.sampler(logits) + persistent) + self.activation_excess)

    def non_torch_bytes(self, tp: int, custom_all_reduce: bool = True) -> int:
        """Non-torch memory at this tp: at tp >= 2 without vLLM's custom all-reduce (PCIe cards beyond two, GPUs
        without peer access, --disable-custom-all-reduce) its buffers are not held."""
        if tp == 1:
            return self.non_torch[0]
        if not custom_all_reduce and self.non_torch_nccl is not None:
            return self.non_torch_nccl
        return self.non_torch[1]

    def cuda_graph_bytes(self, tp: int) -> int:
        return self.cuda_graphs[0] if tp == 1 else self.cuda_graphs[1]

    def total(self, held: Observation) -> int:
        """The overheads this fit predicts for a logged launch."""
        graphs = round(self.cuda_graph_bytes(held.tp) * held.graph_share) if held.cuda_graphs_applied else 0
        non_torch = self.non_torch_bytes(held.tp, held.custom_all_reduce)
        return self.activation(held.forward, held.logits, held.persistent) + non_torch + graphs

    def band(self) -> tuple[int, int]:
        """How far below and above the planned KV the engine may land, bytes: the family's logs' spread."""
        return self.spread

    def unbounded(self) -> str:
        """What a plan says of its KV when too few logs bound the estimates (no margin, no band)."""
        return (
            f"no band and no margin: {self.residuals} public logs fit these estimates, fewer than the "
            f"{MIN_MARGIN_LOGS} that bound them"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "activation_excess_bytes": self.activation_excess,
            "sampler_bytes_per_logit": round(self.sampler_bytes_per_logit, 3),
            "non_torch_bytes": {
                "tp1": self.non_torch[0],
                "tp2_plus": self.non_torch[1],
                **({"tp2_plus_no_custom_all_reduce": self.non_torch_nccl} if self.non_torch_nccl is not None else {}),
            },
            "cuda_graphs_bytes": {"tp1": self.cuda_graphs[0], "tp2_plus": self.cuda_graphs[1]},
            "margin_bytes": self.margin,
            "spread_bytes": {"below": self.spread[0], "above": self.spread[1]},
            "logs": self.logs,
            "residual_logs": self.residuals,
            **({"borrowed_from": self.borrowed} if self.borrowed else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FamilyFit:
        return cls(
            data["family"],
            data["activation_excess_bytes"],
            data.get("sampler_bytes_per_logit", 0.0),
            (data["non_torch_bytes"]["tp1"], data["non_torch_bytes"]["tp2_plus"]),
            (data["cuda_graphs_bytes"]["tp1"], data["cuda_graphs_bytes"]["tp2_plus"]),
            data["margin_bytes"],
            (data["spread_bytes"]["below"], data["spread_bytes"]["above"]),
            data["logs"],
            data.get("residual_logs", 0),
            data.get("borrowed_from", ""),
            data["non_torch_bytes"].get("tp2_plus_no_custom_all_reduce"),
        )


@frozen
class OverheadFit:
    engine: str
    families: dict[str, FamilyFit]
    sources: tuple[str, ...]  # the logs it was fitted on
    excluded: tuple[tuple[str, str], ...] = ()  # (log, why) left out as implausible
    fallbacks: tuple[tuple[str, str], ...] = ()  # (family, the family it plans with when it has too few logs)
    sampler_fallbacks: tuple[tuple[str, str], ...] = ()  # (family, the family whose bytes per logit it borrows)

    def family(self, name: str) -> FamilyFit:
        """A family's fit; one with too few logs plans with the family it falls back to, else the pooled fit, with
        the sampler's bytes per logit of the family it samples like (`sampler_fallbacks`)."""
        if name in self.families:
            return self.families[name]
        fallback = dict(self.fallbacks).get(name)
        found = self.family(fallback) if fallback else self.families[POOLED]
        sampler = dict(self.sampler_fallbacks).get(name)
        if sampler is None:
            return found
        return replace(found, sampler_bytes_per_logit=self.family(sampler).sampler_bytes_per_logit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "families": [fit.to_dict() for fit in self.families.values()],
            "fallbacks": dict(self.fallbacks),
            "sampler_fallbacks": dict(self.sampler_fallbacks),
            "sources": list(self.sources),
            "excluded": [{"log": source, "why": why} for source, why in self.excluded],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OverheadFit:
        families = {item["family"]: FamilyFit.from_dict(item) for item in data["families"]}
        excluded = tuple((item["log"], item["why"]) for item in data.get("excluded", ()))
        fallbacks = tuple(data.get("fallbacks", {}).items())
        samplers = tuple(data.get("sampler_fallbacks", {}).items())
        return cls(data["engine"], families, tuple(data["sources"]), excluded, fallbacks, samplers)


@lru_cache(maxsize=4)
def shipped_fit(engine: str) -> OverheadFit:
    """The fit kvops ships for an engine (kvops/catalog/overheads.json)."""
    import json

    from kvops.packaged import packaged_text

    data = json.loads(packaged_text("kvops.catalog", OVERHEADS_FILE))
    return OverheadFit.from_dict(data[engine])
