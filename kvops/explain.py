"""`kvops explain`: where a vLLM engine's GPU memory went, what its KV cache holds now, and the one next action.

Figures come first from what the engine reported (its startup log, `vllm:cache_config_info` and
`vllm:kv_cache_usage_perc` on a live /metrics), then from nvidia-smi (device total and used), and only for terms
the engine did not report from the planner (`kvops.plan`), each marked with where it came from. A failed run is
read from its own error: which term ran out, with the figures the message states. The next action is the planner's
first way out that fits (`kvops.plan.ways_out`), re-planned on the engine's real KV pool; where the planner cannot
reproduce the failure, the engine's own advice, with its numbers. Pure: parsed inputs in, an `Explanation` out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from math import ceil, floor
from typing import Any

from kvops.engines.metrics import Reading, exact
from kvops.engines.vllm.logs import Failure, VllmLog
from kvops.errors import KvopsError
from kvops.nvidia_smi import SmiDevice
from kvops.plan import Plan, PlanInputs, plan, predict
from kvops.policy import Level, Limits, Policy
from kvops.profile import Profile
from kvops.units import format_bytes

LOG_ROUNDING = "vLLM logs GiB with two decimals: +-5 MiB"
TERMS = ("weights", "non_torch", "activation", "cuda_graphs", "kv_cache")
TERM_LABELS = {
    "weights": "weights", "non_torch": "non-torch memory", "activation": "activation peak", "cuda_graphs": "CUDA graphs",
    "kv_cache": "KV cache", "other_processes": "other processes", "overhead": "overhead",
}


# --- inputs ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    """What one engine run left to read: its log, its live metrics, nvidia-smi beside it."""

    log: VllmLog | None = None
    log_source: str | None = None
    labels: dict[str, str] | None = None  # vllm:cache_config_info
    reading: Reading | None = None  # vllm:kv_cache_usage_perc and the request gauges
    metrics_source: str | None = None
    smi: SmiDevice | None = None
    smi_source: str | None = None
    device_option: str | None = None  # --device, when the run's own lines do not say

    @property
    def facts(self) -> dict[str, Any]:
        return self.log.facts if self.log else {}

    def line(self, fact: str) -> str:
        return self.log.lines.get(fact, "") if self.log else ""

    def quote(self, fact: str) -> str:
        """The words a fact was read from, quoted: 'Model loading took 12.66 GiB'."""
        return f"'{self.log.matches[fact]}'" if self.log and fact in self.log.matches else ""

    @property
    def failure(self) -> Failure | None:
        return self.log.failure if self.log else None

    @property
    def device(self) -> str:
        return (self.log.device if self.log else None) or self.device_option or "gpu"

    def label_int(self, name: str) -> int | None:
        value = (self.labels or {}).get(name)
        return int(value) if value and value.isdigit() else None

    def label_float(self, name: str) -> float | None:
        try:
            return float((self.labels or {})[name])
        except (KeyError, ValueError):
            return None


# --- result ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One memory figure per GPU and where it came from."""

    name: str
    bytes: int | None
    basis: str  # reported | derived | nvidia-smi | input | computed | estimate | exact | missing | n/a
    source: str
    line: str | None = None  # the whole log line it was read from

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class KvNow:
    """The KV pool now, from the engine's usage gauge and its cache config."""

    usage: float
    num_blocks: int
    block_size: int
    used_blocks: int
    free_blocks: int
    bytes_per_block: int | None
    bytes_per_block_source: str
    groups: int
    request_tokens: int | None
    request_blocks: int | None
    request_source: str
    warn_level: float
    running: int | None
    waiting: int | None
    preemptions_total: int | None
    source: str

    @property
    def usable_blocks(self) -> int:
        return max(0, self.num_blocks - 1)

    @property
    def pool_bytes(self) -> int | None:
        return self.num_blocks * self.bytes_per_block if self.bytes_per_block else None

    @property
    def in_use_bytes(self) -> int | None:
        return self.used_blocks * self.bytes_per_block if self.bytes_per_block else None

    @property
    def in_use_tokens(self) -> int:
        """Token slots the used blocks hold (a block is held whole, so tokens cached <= this)."""
        return self.used_blocks * self.block_size // self.groups

    @property
    def headroom_tokens(self) -> int:
        return self.free_blocks * self.block_size // self.groups

    @property
    def headroom_requests(self) -> int | None:
        return self.free_blocks // self.request_blocks if self.request_blocks else None

    @property
    def warn_headroom_blocks(self) -> int:
        return max(0, floor(self.warn_level * self.usable_blocks) - self.used_blocks)

    @property
    def headroom_requests_to_warn(self) -> int | None:
        return self.warn_headroom_blocks // self.request_blocks if self.request_blocks else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "usage": self.usage, "num_blocks": self.num_blocks, "usable_blocks": self.usable_blocks, "block_size": self.block_size,
            "used_blocks": self.used_blocks, "free_blocks": self.free_blocks, "bytes_per_block": self.bytes_per_block,
            "bytes_per_block_source": self.bytes_per_block_source, "kv_cache_groups": self.groups, "pool_bytes": self.pool_bytes,
            "in_use_bytes": self.in_use_bytes, "in_use_tokens": self.in_use_tokens, "headroom_tokens": self.headroom_tokens,
            "request_tokens": self.request_tokens, "request_blocks": self.request_blocks, "request_source": self.request_source,
            "headroom_requests": self.headroom_requests, "warn_level": self.warn_level, "headroom_blocks_to_warn": self.warn_headroom_blocks,
            "headroom_requests_to_warn": self.headroom_requests_to_warn, "running": self.running, "waiting": self.waiting,
            "preemptions_total": self.preemptions_total, "source": self.source,
        }


@dataclass
class Diagnosis:
    """Which term ran out, in the failure's own numbers."""

    term: str  # weights | activation | cuda_graphs | kv_cache | other_processes | unknown
    phase: str | None
    summary: str
    figures: dict[str, Any]
    line: str
    basis: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Action:
    """The one next action, and who computed it."""

    change: str | None
    result: str
    source: str  # planner | engine message | policy | none
    warning: str | None = None
    flags: dict[str, Any] | None = None
    problem: str | None = None  # the planner's need-against-have for the run as it is
    ways_out: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
            "engine": "vllm", "sources": self.sources, "device": self.device, "version": self.version, "state": self.state,
            "memory": {item.name: item.to_dict() for item in self.figures},
            "kv": self.kv.to_dict() if self.kv else None,
            "level": self.level.label if self.level is not None else None, "limits": self.limits.to_dict() if self.limits else None,
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis else None,
            "action": self.action.to_dict(), "notes": self.notes,
        }


# --- explain ----------------------------------------------------------------------------------------------


def explain(run: Run, inputs: PlanInputs | None, policy: Policy, notes: list[str] | None = None) -> Explanation:
    notes = list(notes or [])
    predicted = _predict(inputs, notes)
    figures = memory_figures(run, predicted, inputs)
    kv = kv_now(run, predicted, policy)
    level = policy.raw_level(kv.usage) if kv else None
    diagnosis = diagnose(run.failure, run, figures, predicted)
    action = next_action(run, inputs, kv, level, diagnosis, figures, notes)
    if any(item.basis in ("reported", "derived") for item in figures) and run.log:
        notes.append(f"figures read from the log are rounded: {LOG_ROUNDING}")
    if inputs is None and (diagnosis or level not in (None, Level.OK)):
        notes.append("give --model (and --gpu) for the planner's estimates of unreported terms and its ways out")
    sources = [source for source in (run.log_source, run.metrics_source, run.smi_source) if source]
    return Explanation(sources, run.device, run.facts.get("version"), _state(run), figures, kv, level,
                       policy.limits(level) if level is not None else None, diagnosis, action, notes)


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
    if any(run.facts.get(fact) is not None for fact in ("kv_cache_size_tokens", "num_gpu_blocks", "cudagraph_captured_bytes", "consumed_bytes")):
        return "started"
    return "unknown"


# --- the split ------------------------------------------------------------------------------------------


def memory_figures(run: Run, predicted: Plan | None, inputs: PlanInputs | None) -> list[Figure]:
    """Every term per GPU, each from the best source that has it: the engine, nvidia-smi, then the plan."""
    facts, log = run.facts, run.log
    planned = {term.name: term for term in predicted.memory} if predicted else {}
    figures: list[Figure] = [_total(run, planned)]
    oom = run.failure.oom if run.failure else None
    if run.smi:
        figures.append(Figure("used", run.smi.used_bytes, "nvidia-smi", f"{run.smi_source}: {run.smi.describe()}"))
    elif oom and oom.total_bytes is not None and oom.free_bytes is not None:
        figures.append(Figure("used", oom.total_bytes - oom.free_bytes, "reported", "total - free in torch's out-of-memory message, at the failed allocation", run.failure.line))
    if facts.get("startup_free_bytes") is not None and figures[0].bytes:
        figures.append(Figure("before_engine", figures[0].bytes - facts["startup_free_bytes"], "derived",
                              f"total - free at startup (other processes, CUDA contexts): log {run.quote('startup_free_bytes')}", run.line("startup_free_bytes")))
    figures.append(_requested(run, figures[0], inputs))

    def reported(name: str, value: int | None, fact: str) -> Figure | None:
        return Figure(name, value, "reported", f"log: {run.quote(fact)}", run.line(fact)) if value is not None else None

    def from_plan(name: str) -> Figure:
        term = planned.get(name)
        if term is not None:
            return Figure(name, term.bytes, term.basis, f"plan: {term.formula}")
        if run.device == "cpu":
            return Figure(name, None, "missing", "the CPU build logs no such figure (host memory, not measured per term)")
        return Figure(name, None, "missing", "not reported by the engine" + ("" if predicted else "; give --model for the planner's figure"))

    weights = reported("weights", facts.get("weights_bytes"), "weights_bytes")
    if weights is None and oom and oom.allocated_bytes is not None and run.failure.phase == "weights":
        whole = f"; the plan's full weights: {format_bytes(planned['weights'].bytes)}" if "weights" in planned else ""
        weights = Figure("weights", oom.allocated_bytes, "reported", f"at least: PyTorch's allocation when loading failed, {format_bytes(oom.tried_bytes)} more asked{whole}", run.failure.line)
    non_torch = reported("non_torch", facts.get("non_torch_bytes"), "non_torch_bytes")
    if non_torch is None and log and log.non_torch_bytes is not None:
        non_torch = Figure("non_torch", log.non_torch_bytes, "derived", f"log {run.quote('consumed_bytes')} less the weights", run.line("consumed_bytes"))
    if weights is None and non_torch is None and "consumed_bytes" in facts:
        figures.append(Figure("weights+non_torch", facts["consumed_bytes"], "reported", f"log: {run.quote('consumed_bytes')}", run.line("consumed_bytes")))
    else:
        figures.append(weights or from_plan("weights"))
        figures.append(non_torch or from_plan("non_torch"))
    figures.append(_activation(run, from_plan))
    figures.append(_cuda_graphs(run, figures[0].bytes, from_plan))
    figures.append(_kv_cache(run, predicted, from_plan))
    figures = [_not_reached(run, item) for item in figures]
    overhead = _overhead(figures)
    if overhead:
        figures.append(overhead)
    return figures + _totals(figures)


# The terms a failure came before: the engine never measured or allocated them.
_NOT_REACHED = {
    "weights": ("activation", "cuda_graphs", "kv_cache"),
    "startup_free_memory": ("weights", "non_torch", "activation", "cuda_graphs", "kv_cache"),
}


def _not_reached(run: Run, item: Figure) -> Figure:
    failure = run.failure
    key = failure.kind if failure and failure.kind == "startup_free_memory" else failure.phase if failure else None
    if item.name not in _NOT_REACHED.get(key, ()) or item.basis in ("reported", "derived"):
        return item
    planned = f" (the plan's figure: {format_bytes(item.bytes)})" if item.bytes is not None and item.basis in ("computed", "estimate") else ""
    where = "at its startup check" if key == "startup_free_memory" else "while loading the weights"
    return Figure(item.name, None, "n/a", f"not reached: the engine failed {where}{planned}")


def _implied_kv(run: Run) -> Figure | None:
    """KV the budget left when the log itemises every other term: budget - weights - activation - non-torch
    (- the CUDA-graph estimate, when vLLM applied one), as `determine_available_memory` computes it."""
    log, facts = run.log, run.facts
    if not log or "requested_bytes" not in facts or "weights_bytes" not in facts or log.activation_bytes is None or log.non_torch_bytes is None:
        return None
    reserve = log.cudagraph_estimate_applied or 0
    kv = facts["requested_bytes"] - facts["weights_bytes"] - log.activation_bytes - log.non_torch_bytes - reserve
    graphs = " - the CUDA-graph estimate" if reserve else ""
    return Figure("kv_cache", kv, "derived", f"budget - weights - activation peak - non-torch{graphs}: what the log's figures leave (vLLM's sizing)")


def _overhead(figures: list[Figure]) -> Figure | None:
    """When the engine reported its budget, weights and KV but not every other term: their sum, as its numbers
    imply it (vLLM sizes KV = budget - weights - non-torch - activation peak [- CUDA-graph estimate, 0.21+])."""
    by_name = {item.name: item for item in figures}
    requested, weights, kv = by_name["requested"], by_name.get("weights"), by_name["kv_cache"]
    others = [by_name[name] for name in ("non_torch", "activation") if name in by_name]
    if requested.bytes is None or kv.basis != "reported" or kv.bytes is None or weights is None:
        return None
    if weights.basis != "reported":
        return Figure("weights+overhead", requested.bytes - kv.bytes, "derived",
                      "budget - KV cache: weights + non-torch + activation peak (+ the CUDA-graph estimate vLLM >= 0.21 reserves), as the engine sized them")
    if all(item.basis in ("reported", "derived") for item in others):
        return None
    return Figure("overhead", requested.bytes - weights.bytes - kv.bytes, "derived",
                  "budget - weights - KV cache: non-torch + activation peak (+ the CUDA-graph estimate vLLM >= 0.21 reserves), as the engine sized them")


def known_kv_pool(run: Run) -> int | None:
    """The KV pool the run states: pinned, in its KV error, or in its log (None when not positive)."""
    failure = run.failure
    pool = _pinned(run) or (failure.available_bytes if failure else None) or run.facts.get("kv_cache_bytes")
    return pool if pool and pool > 0 else None


def device_total(run: Run) -> int | None:
    """The device total the run's own outputs state (nvidia-smi, the log, an error message), for the planner."""
    return _total(run, {}).bytes


def _total(run: Run, planned: dict) -> Figure:
    if run.smi:
        return Figure("total", run.smi.total_bytes, "nvidia-smi", f"{run.smi_source}: {run.smi.describe()}")
    if run.facts.get("total_memory_bytes"):
        what = "host memory of the NUMA node (CPU build)" if run.device == "cpu" else "the device total torch saw"
        return Figure("total", run.facts["total_memory_bytes"], "reported", f"{what}: log {run.quote('total_memory_bytes')}", run.line("total_memory_bytes"))
    failure = run.failure
    if failure and failure.oom and failure.oom.total_bytes:
        return Figure("total", failure.oom.total_bytes, "reported", "torch's out-of-memory message: 'GPU N has a total capacity of ...'", failure.line)
    if failure and failure.total_bytes:
        return Figure("total", failure.total_bytes, "reported", "the startup check: 'Free memory on device (free/total GiB)'", failure.line)
    if "total" in planned:
        return Figure("total", planned["total"].bytes, planned["total"].basis, planned["total"].formula)
    return Figure("total", None, "missing", "no device total: give --nvidia-smi FILE, --gpu NAME or --gpu-memory SIZE")


def _requested(run: Run, total: Figure, inputs: PlanInputs | None) -> Figure:
    facts = run.facts
    if facts.get("requested_bytes"):
        return Figure("requested", facts["requested_bytes"], "reported", f"log: {run.quote('requested_bytes')}", run.line("requested_bytes"))
    pinned = _pinned(run)
    if pinned:
        return Figure("requested", None, "n/a", f"--kv-cache-memory-bytes {pinned}: vLLM sizes nothing from gpu_memory_utilization")
    stated = facts.get("gpu_memory_utilization") or (facts["cudagraph_utilization"][0] if "cudagraph_utilization" in facts else None) or run.label_float("gpu_memory_utilization")
    utilization = stated or (inputs.memory_fraction if inputs else None)
    if utilization and total.bytes and run.device == "gpu":
        where = "the run's" if stated else "the given"
        return Figure("requested", ceil(total.bytes * utilization), "derived", f"ceil(total x {where} gpu_memory_utilization {utilization:g}) (vLLM's budget)")
    return Figure("requested", None, "missing", "gpu_memory_utilization not known")


def _pinned(run: Run) -> int | None:
    pinned = run.log.args.get("kv_cache_memory_bytes") if run.log else None
    return pinned or run.label_int("kv_cache_memory_bytes")


def _activation(run: Run, from_plan) -> Figure:
    log, facts = run.log, run.facts
    value = log.activation_bytes if log else None
    if value is None:
        return from_plan("activation")
    if "activation_bytes" in facts:
        return Figure("activation", value, "reported", f"log: {run.quote('activation_bytes')}", run.line("activation_bytes"))
    if "peak_torch_bytes" in facts:
        return Figure("activation", value, "derived", f"log {run.quote('peak_torch_bytes')} less the weights", run.line("peak_torch_bytes"))
    applied = log.cudagraph_estimate_applied
    if applied:
        return Figure("activation", value, "derived", f"log {run.quote('peak_activation_bytes')} less the CUDA-graph estimate ({format_bytes(applied)}) vLLM counts in it", run.line("peak_activation_bytes"))
    return Figure("activation", value, "reported", f"log: {run.quote('peak_activation_bytes')}", run.line("peak_activation_bytes"))


def _cuda_graphs(run: Run, total: int | None, from_plan) -> Figure:
    facts, log = run.facts, run.log
    if run.device == "cpu":
        return Figure("cuda_graphs", 0, "exact", "the CPU build captures no CUDA graphs")
    if log and log.args.get("enforce_eager"):
        return Figure("cuda_graphs", 0, "exact", "--enforce-eager: no CUDA graphs")
    if "cudagraph_captured_bytes" in facts:
        reserve = log.cudagraph_estimate_applied
        extra = f" (vLLM reserved its estimate, {format_bytes(reserve)}, for them in the budget)" if reserve else ""
        return Figure("cuda_graphs", facts["cudagraph_captured_bytes"], "reported", f"log: {run.quote('cudagraph_captured_bytes')}{extra}", run.line("cudagraph_captured_bytes"))
    estimate = log.cudagraph_bytes(facts.get("total_memory_bytes") or total) if log else None
    if estimate is not None:
        if "cudagraph_bytes" in facts:
            return Figure("cuda_graphs", estimate, "reported", f"vLLM's estimate, reserved before sizing KV: log {run.quote('cudagraph_bytes')}", run.line("cudagraph_bytes"))
        return Figure("cuda_graphs", estimate, "derived", f"vLLM's estimate, reserved before sizing KV: the utilization it is worth x total, log {run.quote('cudagraph_utilization')}",
                      run.line("cudagraph_utilization"))
    return from_plan("cuda_graphs")


def _kv_cache(run: Run, predicted: Plan | None, from_plan) -> Figure:
    pinned = _pinned(run)
    if pinned:
        where = "the run's --kv-cache-memory-bytes" if run.log and run.log.args.get("kv_cache_memory_bytes") else "vllm:cache_config_info kv_cache_memory_bytes"
        return Figure("kv_cache", pinned, "reported", f"{where} (vLLM allocates exactly this)")
    if "kv_cache_bytes" in run.facts:
        return Figure("kv_cache", run.facts["kv_cache_bytes"], "reported", f"log: {run.quote('kv_cache_bytes')}", run.line("kv_cache_bytes"))
    failure = run.failure
    if failure and failure.kind == "kv_too_small" and failure.available_bytes is not None:
        return Figure("kv_cache", failure.available_bytes, "reported", "the KV error: 'larger than the available KV cache memory (...)'", failure.line)
    implied = _implied_kv(run)
    if implied is not None:
        return implied
    blocks = run.label_int("num_gpu_blocks")
    if blocks and predicted:
        per_block = predicted.capacity["bytes_per_block"]
        return Figure("kv_cache", blocks * per_block, "derived", f"vllm:cache_config_info num_gpu_blocks {blocks} x {per_block} B per block (plan's layout)")
    return from_plan("kv_cache")


def _totals(figures: list[Figure]) -> list[Figure]:
    """The engine's memory in all (the derived overhead standing for the terms it covers) and what is left."""
    by_name = {item.name: item for item in figures}
    derived = next((name for name in ("overhead", "weights+overhead") if name in by_name), None)
    names = {"overhead": ("weights", "overhead", "kv_cache"), "weights+overhead": ("weights+overhead", "kv_cache")}.get(derived, (*TERMS, "weights+non_torch"))
    parts = [item for item in figures if item.name in names]
    known = [item for item in parts if item.bytes is not None]
    if not known:
        return []
    engine = sum(max(0, item.bytes) for item in known)
    missing = [item.name for item in parts if item.bytes is None]
    bases = ", ".join(sorted({item.basis for item in known}))
    what = {"overhead": "weights + overhead + KV cache", "weights+overhead": "weights + overhead + KV cache (the budget)"}.get(derived, "sum of the terms above")
    out = [Figure("engine", engine, "derived", f"{what} ({bases})" + (f"; without {', '.join(missing)}" if missing else ""))]
    total, used, before = by_name["total"], by_name.get("used"), by_name.get("before_engine")
    if used is not None and used.basis == "nvidia-smi":
        unreported = f", and the unreported {', '.join(missing)}" if missing else ""
        out.append(Figure("outside_engine", used.bytes - engine, "derived", f"nvidia-smi used - the engine's terms: CUDA context, other processes, allocator cache{unreported}"))
    if total.bytes is not None and used is not None:
        out.append(Figure("free", total.bytes - used.bytes, "derived", "total - used"))
    elif total.bytes is not None and not missing and before is not None:
        out.append(Figure("free", total.bytes - before.bytes - engine, "derived", "total - held before startup - the engine's terms"))
    elif total.bytes is not None and not missing:
        out.append(Figure("free", total.bytes - engine, "derived", "total - the engine's terms (free, CUDA context, other processes)"))
    return out


# --- KV now ---------------------------------------------------------------------------------------------


def kv_now(run: Run, predicted: Plan | None, policy: Policy) -> KvNow | None:
    """Blocks in use from `vllm:kv_cache_usage_perc` (1 - free / (num_gpu_blocks - 1), block_pool.get_usage)."""
    reading = run.reading
    if reading is None:
        return None
    blocks = run.label_int("num_gpu_blocks") or run.facts.get("num_gpu_blocks") or (predicted.capacity.get("num_blocks") if predicted else None)
    block_size = run.label_int("block_size") or (predicted.capacity.get("block_size") if predicted else None)
    if not blocks or not block_size:
        return None
    usable = max(0, blocks - 1)
    used = round(reading.kv_usage * usable)
    per_block, per_block_source = _bytes_per_block(run, predicted, blocks)
    groups = predicted.capacity.get("kv_cache_groups", 1) if predicted else 1
    tokens, request_blocks, request_source = _request_size(run, predicted, blocks, block_size)
    warn = policy.thresholds[Level.WARN]
    return KvNow(
        usage=reading.kv_usage, num_blocks=blocks, block_size=block_size, used_blocks=used, free_blocks=usable - used,
        bytes_per_block=per_block, bytes_per_block_source=per_block_source, groups=groups, request_tokens=tokens,
        request_blocks=request_blocks, request_source=request_source, warn_level=warn,
        running=exact(reading.running), waiting=exact(reading.waiting), preemptions_total=exact(reading.preemptions_total),
        source=f"{reading.basis} x (vllm:cache_config_info num_gpu_blocks {blocks} - 1 null block)",
    )


def _bytes_per_block(run: Run, predicted: Plan | None, blocks: int) -> tuple[int | None, str]:
    if predicted:
        return predicted.capacity["bytes_per_block"], "computed: the plan's KV layout for this model"
    pinned = _pinned(run)
    if pinned:
        return pinned // blocks, f"~ --kv-cache-memory-bytes {pinned} / {blocks} blocks (give --model for the exact block size)"
    kv = run.facts.get("kv_cache_bytes")
    if kv and kv > 0:
        return kv // blocks, f"~ the log's KV cache memory / {blocks} blocks (give --model for the exact block size)"
    return None, "unknown: give --model"


def _request_size(run: Run, predicted: Plan | None, blocks: int, block_size: int) -> tuple[int | None, int | None, str]:
    """Blocks one request of the planned size holds: the plan's workload, else the engine's max_model_len."""
    if predicted:
        cap = predicted.capacity
        source = predicted.inputs.workload.source
        what = f"the workload ({source})" if source != "none" else f"max_model_len {cap['max_model_len']}"
        return cap["tokens_per_request"], cap["blocks_per_request"], what
    tokens_in_pool = run.label_int("kv_cache_size_tokens") or (run.log.kv_cache_size_tokens if run.log else None)
    concurrency = run.label_float("kv_cache_max_concurrency") or (run.log.max_concurrency if run.log else None)
    length = run.log.max_model_len if run.log else None
    if length is None and tokens_in_pool and concurrency:
        length = round(tokens_in_pool / concurrency)  # kv_cache_size_tokens = int(concurrency x max_model_len)
    if concurrency:
        per_request = round(blocks / concurrency)  # max concurrency = num_gpu_blocks / blocks per request
        return length, per_request, f"max_model_len {length} at the engine's own max concurrency {concurrency:g}x"
    if length:
        return length, -(-length // block_size), f"max_model_len {length}, one full-attention KV group assumed (give --model for the exact layout)"
    return None, None, "unknown: give --model or --prompt-tokens/--gen-tokens"


# --- failures -------------------------------------------------------------------------------------------


def diagnose(failure: Failure | None, run: Run, figures: list[Figure], predicted: Plan | None) -> Diagnosis | None:
    if failure is None:
        return None
    if failure.kind == "kv_too_small":
        return _kv_too_small(failure, run, predicted)
    if failure.kind == "no_kv_memory":
        return _no_kv_memory(failure, run, figures)
    if failure.kind == "startup_free_memory":
        others = failure.total_bytes - failure.startup_free_bytes
        return Diagnosis(
            "other_processes", None,
            f"vLLM needs {format_bytes(failure.requested_bytes)} ({failure.utilization:g} x {format_bytes(failure.total_bytes)}) but only "
            f"{format_bytes(failure.startup_free_bytes)} was free at startup: something else holds {format_bytes(others)} of the device",
            {"free_bytes": failure.startup_free_bytes, "total_bytes": failure.total_bytes, "requested_bytes": failure.requested_bytes,
             "utilization": failure.utilization, "held_by_others_bytes": others}, failure.line, "why: vLLM's startup check wants gpu_memory_utilization x total free")
    return _out_of_memory(failure, run)


def _kv_too_small(failure: Failure, run: Run, predicted: Plan | None) -> Diagnosis:
    figures: dict[str, Any] = {"max_model_len": failure.max_model_len}
    pinned = _pinned(run)
    if failure.kv_tokens is not None:  # V0: the pool held kv_tokens tokens
        figures["kv_tokens"] = failure.kv_tokens
        text = f"one request at max_model_len {failure.max_model_len:,} does not fit the KV cache: it holds {failure.kv_tokens:,} tokens"
        if run.facts.get("kv_cache_bytes") is not None:
            figures["available_bytes"] = run.facts["kv_cache_bytes"]
            text += f" ({format_bytes(run.facts['kv_cache_bytes'])})"
    else:
        available = pinned or failure.available_bytes
        needed = _needed_kv(failure, predicted)
        figures |= {"needed_bytes": needed, "available_bytes": available, "estimated_max_model_len": failure.estimated_max_model_len,
                    "message_needed_bytes": failure.needed_bytes, "message_available_bytes": failure.available_bytes}
        text = (f"one request at max_model_len {failure.max_model_len:,} needs {format_bytes(needed)} of KV cache, "
                f"the engine had {format_bytes(available)}")
        if failure.estimated_max_model_len:
            text += f"; vLLM estimates {failure.estimated_max_model_len:,} tokens fit"
    basis = ("why: --kv-cache-memory-bytes pins a pool too small for --max-model-len" if pinned else
             "why: the budget left after weights, activation peak and non-torch (and, from vLLM 0.21, the CUDA-graph estimate) holds less than one request at max_model_len")
    return Diagnosis("kv_cache", None, text, figures, failure.line, basis)


def _needed_kv(failure: Failure, predicted: Plan | None) -> int:
    """KV for one request at max_model_len (`max_memory_usage_bytes`): the plan's exact figure when it models
    this run (the message rounds to 0.01 GiB), else the message's."""
    cap = predicted.capacity if predicted else {}
    if cap.get("max_model_len") == failure.max_model_len and cap.get("blocks_per_request_at_max_model_len"):
        return cap["bytes_per_block"] * cap["blocks_per_request_at_max_model_len"]
    return failure.needed_bytes


def _no_kv_memory(failure: Failure, run: Run, figures: list[Figure]) -> Diagnosis:
    by_name = {item.name: item for item in figures}
    kv = failure.available_bytes if failure.available_bytes is not None else run.facts.get("kv_cache_bytes")
    parts = [by_name[name] for name in ("weights", "non_torch", "activation") if name in by_name and by_name[name].bytes is not None]
    took = ", ".join(f"{TERM_LABELS[item.name]} {format_bytes(item.bytes)} ({item.basis})" for item in parts)
    requested = by_name.get("requested")
    budget = f" of the {format_bytes(requested.bytes)} budget" if requested and requested.bytes else ""
    text = f"nothing was left for the KV cache{budget} after the other terms" + (f" ({format_bytes(kv)} available)" if kv is not None else "") + (f": {took}" if took else "")
    return Diagnosis("kv_cache", None, text, {"available_bytes": kv, "requested_bytes": requested.bytes if requested else None,
                                        **{f"{item.name}_bytes": item.bytes for item in parts}}, failure.line,
                     "why: weights, activation peak and non-torch took the whole budget")


PHASE_TEXT = {
    "weights": "while loading the weights",
    "activation": "in the profile run or sampler warm-up (the activation peak)",
    "cuda_graphs": "while capturing CUDA graphs",
    "kv_cache": "while allocating the KV cache",
    "serving": "while serving (a forward pass after startup)",
}


def _out_of_memory(failure: Failure, run: Run) -> Diagnosis:
    oom = failure.oom
    term = {"serving": "activation"}.get(failure.phase, failure.phase) or "unknown"
    where = PHASE_TEXT.get(failure.phase, "at a point the log does not show")
    if oom is None:
        return Diagnosis(term, failure.phase, f"out of memory {where}; the error carries no figures", {}, failure.line, _phase_basis(failure))
    figures = {key: value for key, value in asdict(oom).items() if key != "other_processes"}
    figures["other_processes"] = [{"pid": pid, "bytes": amount} for pid, amount in oom.other_processes]
    text = f"out of memory {where}: {oom.backend} could not allocate {format_bytes(oom.tried_bytes)}"
    if oom.free_bytes is not None and oom.total_bytes is not None:
        text += f" with {format_bytes(oom.free_bytes)} free of {format_bytes(oom.total_bytes)}"
        shortfall = oom.shortfall_bytes
        figures["shortfall_bytes"] = shortfall
        if shortfall <= 0:
            text += " (more was free than asked: fragmentation or a device limit, not the total)"
    if oom.process_bytes is not None:
        text += f"; the engine held {format_bytes(oom.process_bytes)}"
        if oom.allocated_bytes is not None:
            text += f" ({format_bytes(oom.allocated_bytes)} in PyTorch tensors"
            text += f", {format_bytes(oom.private_pool_bytes)} in CUDA-graph pools" if oom.private_pool_bytes else ""
            text += ")"
    others = _held_by_others(oom)
    if others is not None:
        figures["held_by_others_bytes"] = others
        if others >= 256 << 20:
            text += f"; other processes held {format_bytes(others)}"
            shortfall = oom.shortfall_bytes
            if shortfall is not None and 0 < shortfall <= others:
                text += " (without them the allocation would have fit)"
                term = "other_processes"
    elif oom.other_processes:
        listed = ", ".join(f"process {pid} {format_bytes(amount)}" for pid, amount in oom.other_processes)
        text += f"; on the device: {listed} (torch names the engine itself by PID inside a container)"
    return Diagnosis(term, failure.phase, text, figures, failure.line, _phase_basis(failure))


def _phase_basis(failure: Failure) -> str:
    return f"phase read from {failure.phase_basis}" if failure.phase_basis else "phase unknown: no traceback frame or startup line names it"


def _held_by_others(oom) -> int | None:
    """Device memory neither free nor this process's: total - free - this process (torch rounds to 0.01 units)."""
    if None in (oom.total_bytes, oom.free_bytes, oom.process_bytes):
        return None
    return max(0, oom.total_bytes - oom.free_bytes - oom.process_bytes)


# --- the next action ------------------------------------------------------------------------------------


def next_action(run: Run, inputs: PlanInputs | None, kv: KvNow | None, level: Level | None, diagnosis: Diagnosis | None,
                figures: list[Figure], notes: list[str]) -> Action:
    if diagnosis is not None:
        return _failure_action(run, inputs, diagnosis, figures, notes)
    if kv is None or level is None:
        return Action(None, "no live KV usage to act on: give --metrics URL for the level and headroom", "none")
    if level <= Level.OK:
        return Action(None, f"none: KV at {kv.usage:.1%}, under the warn level ({kv.warn_level:.0%})", "policy")
    if inputs is None:
        return Action(None, f"KV at {kv.usage:.1%} ({level.label}): give --model for the planner's way out", "none")
    demand = max(1, (kv.running or 0) + (kv.waiting or 0))
    pool = kv.pool_bytes or _pinned(run)
    changed = replace(inputs, concurrency=demand, kv_cache_memory_bytes=pool, gpu=None, profile=None) if pool else replace(inputs, concurrency=demand)
    action = _planner(changed, notes)
    if action is None:
        return Action(None, f"the planner fits {demand} requests of {kv.request_tokens} tokens under the warn level in this pool, yet KV is at "
                            f"{kv.usage:.1%}: the requests are larger than planned; give their real size (--prompt-tokens/--gen-tokens or --workload)", "planner")
    return action


def _failure_action(run: Run, inputs: PlanInputs | None, diagnosis: Diagnosis, figures: list[Figure], notes: list[str]) -> Action:
    failure = run.failure
    if failure.kind == "startup_free_memory":
        fraction = floor(failure.startup_free_bytes / failure.total_bytes * 100) / 100
        return Action(f"--gpu-memory-utilization {fraction:.2f}", f"fits the {format_bytes(failure.startup_free_bytes)} free at startup; or free the "
                                                                   f"{format_bytes(diagnosis.figures['held_by_others_bytes'])} other processes hold", "engine message")
    if inputs is not None:
        action = _planner(_replan_inputs(run, inputs, diagnosis, figures), notes, pinned_by_user=bool(_pinned(run)))
        if action is not None:
            return action
    return _engine_advice(run, diagnosis, inputs)


def _replan_inputs(run: Run, inputs: PlanInputs, diagnosis: Diagnosis, figures: list[Figure]) -> PlanInputs:
    """The run as the planner must see it to reproduce the failure: its measured terms (weights, and the overhead
    its budget implies) when the log states its budget, else its real KV pool pinned."""
    failure = run.failure
    if failure.kind not in ("kv_too_small", "no_kv_memory"):
        return inputs
    by_name = {item.name: item for item in figures}
    total, requested, weights, kv = by_name["total"].bytes, by_name["requested"].bytes, by_name.get("weights"), by_name["kv_cache"]
    if total and requested and weights is not None and weights.basis == "reported" and kv.bytes is not None and not _pinned(run):
        overhead = requested - weights.bytes - kv.bytes
        profile = Profile("vllm", run.log_source or "the log", tp=inputs.tp, total_memory_bytes=total, weights_bytes=weights.bytes, overhead_bytes=max(0, overhead))
        return replace(inputs, profile=profile, kv_cache_memory_bytes=None, concurrency=None)
    pool = _pinned(run) or diagnosis.figures.get("available_bytes") or run.facts.get("kv_cache_bytes")
    if pool and pool > 0:
        return replace(inputs, kv_cache_memory_bytes=pool, gpu=None, profile=None, concurrency=None, max_model_len=failure.max_model_len or inputs.max_model_len)
    return inputs


def _planner(inputs: PlanInputs, notes: list[str], pinned_by_user: bool = False) -> Action | None:
    """The planner's next action for a run that does not fit; None when the planner finds it fits as it is.

    A pinned KV pool (`--kv-cache-memory-bytes`) too small for the plan: the size the plan needs. Otherwise the
    first way out that fits, in the planner's order (quantized KV, more tp, more replicas, a larger GPU); a shorter
    context only when it still holds the planned request size, else as the last resort it is (it changes what the
    service accepts). `--concurrency auto` is not a change to the deployment and is never chosen."""
    try:
        result = plan(inputs)
    except KvopsError as exc:
        notes.append(f"the planner could not re-plan this run: {exc}")
        return None
    if result.fits:
        return None
    if pinned_by_user and result.need_bytes and result.kv_cache_bytes < result.need_bytes:
        return Action(f"--kv-cache-memory-bytes {result.need_bytes}", f"the KV pool the plan needs ({format_bytes(result.need_bytes)}; the run pinned "
                                                                       f"{format_bytes(result.kv_cache_bytes)})", "planner", problem=result.problem, ways_out=result.ways_out)
    ways = [way for way in result.ways_out if not way["change"].startswith("--concurrency")]
    wanted = inputs.workload.total_tokens

    def keeps_the_requests(way: dict[str, Any]) -> bool:
        return way["change"] != "--max-model-len auto" or bool(wanted and way["flags"]["max-model-len"] >= wanted)

    chosen = next((way for way in ways if way["fits"] and keeps_the_requests(way)), None) or next((way for way in ways if way["fits"]), None)
    if chosen is None:
        tried = ", ".join(way["change"] for way in ways if way["fits"] is False)
        return Action(None, f"no single change fits (tried {tried})", "planner", problem=result.problem, ways_out=result.ways_out)
    warning = chosen.get("warning")
    if not keeps_the_requests(chosen):
        warning = f"requests longer than {chosen['flags']['max-model-len']:,} tokens are rejected; nothing else the planner tried fits"
    return Action(_concrete(chosen), chosen["result"], "planner", warning, chosen.get("flags"), result.problem, result.ways_out)


def _concrete(way: dict[str, Any]) -> str:
    """'--max-model-len auto' as the value the planner chose."""
    if way["change"] == "--max-model-len auto" and way.get("flags"):
        return f"--max-model-len {way['flags']['max-model-len']}"
    return way["change"]


def _engine_advice(run: Run, diagnosis: Diagnosis, inputs: PlanInputs | None) -> Action:
    """What the engine's own message and figures say to change, when the planner has no way out to offer."""
    failure, figures = run.failure, diagnosis.figures
    why = "" if inputs else " (give --model for the planner's ways out)"
    if failure.kind == "kv_too_small":
        length = failure.estimated_max_model_len or (failure.kv_tokens if failure.kv_tokens else None)
        if length:
            return Action(f"--max-model-len {length}", f"the longest context the engine's own figures fit{why}", "engine message")
    if diagnosis.term == "other_processes":
        return Action(None, f"free the {format_bytes(figures['held_by_others_bytes'])} other processes hold on the device, or lower --gpu-memory-utilization", "engine message")
    advice = {
        "weights": ("--tensor-parallel-size 2", "split the weights over more GPUs (or --quantization, or a larger GPU)"),
        "activation": ("--max-num-seqs / --max-num-batched-tokens lower", "the profile run and sampler warm-up size their peak from these"),
        "cuda_graphs": ("--enforce-eager", "no CUDA graphs (or lower --gpu-memory-utilization to leave them room)"),
        "kv_cache": ("--gpu-memory-utilization lower", "a smaller KV pool leaves the allocation room"),
    }.get(diagnosis.term)
    if diagnosis.term == "kv_cache" and figures.get("shortfall_bytes") and figures.get("total_bytes"):
        utilization = run.facts.get("gpu_memory_utilization") or (inputs.memory_fraction if inputs else None)
        if utilization:
            lower = floor((utilization - figures["shortfall_bytes"] / figures["total_bytes"]) * 100) / 100
            return Action(f"--gpu-memory-utilization {lower:.2f}", f"leaves the {format_bytes(figures['shortfall_bytes'])} the allocation lacked{why}", "engine message")
    if advice:
        return Action(advice[0], advice[1] + why, "engine message")
    return Action(None, "the log does not show which term ran out" + why, "none")
