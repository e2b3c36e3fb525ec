"""The device total as the engine sees it: torch's total of the GPU (a measurement or a public engine log,
kvops/catalog/device_totals.json), else nvidia-smi's total less what drivers are seen to keep."""

from __future__ import annotations

from functools import lru_cache
from math import floor

from kvops.engines.common import CALIBRATE_HINT
from kvops.errors import MissingDevice
from kvops.frozen import frozen
from kvops.gpus import gpu_catalog
from kvops.plan import PlanInputs, Term
from kvops.units import GiB

MiB = 1 << 20


@frozen
class EngineTotal:
    """A GPU's total as torch reports it to the engine (kvops/catalog/device_totals.json): the bytes measured on the
    GPU where kvops has them, else a public engine log's GiB with the log's own decimals."""

    bytes: int
    printed: str
    source: str


@lru_cache(maxsize=1)
def _device_totals() -> tuple[dict[str, EngineTotal], float]:
    import json

    from kvops.packaged import packaged_text

    data = json.loads(packaged_text("kvops.catalog", "device_totals.json"))
    totals = {
        gpu_id: EngineTotal(item.get("bytes") or round(float(item["gib"]) * GiB), item["printed"], item["source"])
        for gpu_id, item in data["devices"].items()
    }
    reserved = [1 - totals[gpu.id].bytes / gpu.memory_bytes for gpu in gpu_catalog() if gpu.id in totals]
    return totals, max(reserved)


def engine_total(gpu_id: str) -> EngineTotal | None:
    return _device_totals()[0].get(gpu_id)


def largest_reserved_fraction() -> float:
    """The largest share of nvidia-smi's total the driver keeps from torch, among GPUs whose both totals are known."""
    return _device_totals()[1]


def device_total(inputs: PlanInputs) -> int:
    """Bytes per device as the engine sees them: what it measured (a profile), else the table, else an estimate."""
    return device_total_term(inputs).bytes


def device_total_term(inputs: PlanInputs) -> Term:
    """The device total: a profile's measured one when it ran on the plan's GPU, else the GPU's engine-side total."""
    profile = inputs.profile
    same_gpu = profile is not None and (profile.gpu is None or inputs.gpu is None or profile.gpu == inputs.gpu.id)
    if profile and profile.total_memory_bytes and same_gpu:
        return Term(
            "total",
            profile.total_memory_bytes,
            "measured",
            f"device total the engine measured (profile {profile.source})",
        )
    gpu = inputs.gpu
    if gpu is None:
        raise MissingDevice("missing --gpu NAME or --gpu-memory SIZE")
    if gpu.reported_by == "--gpu-memory":
        return Term("total", gpu.memory_bytes, "input", f"{gpu.source}: taken as the total the engine sees")
    if gpu.vendor == "amd":
        return Term(
            "total",
            gpu.memory_bytes,
            "input",
            f"{gpu.id}: {gpu.memory_mib:g} MiB as {gpu.reported_by} reports it, the total torch sees on ROCm ({gpu.source})",
        )
    seen = engine_total(gpu.id)
    if seen is not None:
        return Term(
            "total",
            seen.bytes,
            "input",
            f"{gpu.id}: {seen.bytes / GiB:.2f} GiB as torch reports it to the engine ('{seen.printed}', {seen.source}); "
            f"{gpu.reported_by} shows {gpu.memory_mib:g} MiB",
        )
    reserved = largest_reserved_fraction()
    return Term(
        "total",
        floor(gpu.memory_bytes * (1 - reserved)),
        "estimate",
        f"{gpu.id}: {gpu.memory_mib:g} MiB as {gpu.reported_by} reports it, less {reserved:.2%} the driver keeps "
        "(the largest share seen among GPUs whose engine-side total is known)",
        CALIBRATE_HINT,
    )
